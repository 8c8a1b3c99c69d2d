"""``verl-vllm-rm``: serve, score, check, report, demo, bench, build the tiny demo reward model, and write the
generated reference pages of the docs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from verl_vllm_rm.dev.cpu_profile import BASE_MODES
from verl_vllm_rm.dev.tiny_ppo import PAIR_SOURCES
from verl_vllm_rm.protocol.defaults import API_KEY_ENV, DEFAULT_SERVER_URL


def _serve(args: argparse.Namespace, rest: list[str]) -> int:
    from verl_vllm_rm.replicas.launcher import find_server_python

    python = args.server_python or find_server_python()
    os.execv(python, [python, "-m", "verl_vllm_rm.server", *rest])
    return 0  # not reached


def _score(args: argparse.Namespace, rest: list[str]) -> int:
    from verl_vllm_rm.client.http import HttpError, JsonHttp

    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    payload = {"input": texts, "normalize": args.normalize}
    try:
        body = JsonHttp(args.url, args.api_key, args.timeout).post("/score", payload)
    except HttpError as e:
        print(f"score: {e}", file=sys.stderr)
        return 1
    for item, text in zip(body["data"], texts):
        print(f"{item['score']:+.6f}\t{text}")
    return 0


def _tiny_rm(args: argparse.Namespace, rest: list[str]) -> int:
    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm

    print(build_tiny_rm(args.out))
    return 0


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from verl_vllm_rm.dev.demo import main as run_demo
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOError

    try:
        run_demo(args.workdir, train_seconds=args.train_seconds, seed=args.seed, steps=args.steps)
    except TinyPPOError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    return 0


def _tiny_ppo(args: argparse.Namespace, rest: list[str]) -> int:
    from verl_vllm_rm.dev.ppo_report import print_summary
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, TinyPPOError, run_tiny_ppo

    work_dir = args.work_dir or tempfile.mkdtemp(prefix="verl-vllm-rm-tiny-ppo-")
    extra = rest[1:] if rest[:1] == ["--"] else rest
    try:
        cfg = TinyPPOConfig(work_dir, steps=args.steps, rm=args.rm, online=args.online, extra_overrides=extra,
                            server_url=args.server_url, replicas=args.replicas, seed=args.seed, mode=args.mode)
        print_summary(run_tiny_ppo(cfg))
    except (TinyPPOError, ValueError) as e:
        print(f"tiny-ppo: {e}", file=sys.stderr)
        return 1
    return 0


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    import runpy

    from verl_vllm_rm.replicas.launcher import REPO_ROOT

    scripts = sorted((REPO_ROOT / "benchmarks").glob("bench_*.py"))
    if not scripts:
        print("benchmarks/ not found: run `verl-vllm-rm bench` from a source checkout", file=sys.stderr)
        return 2
    for script in scripts:
        if args.only and not any(name in script.stem for name in args.only):
            continue
        print(f"== {script.name}", flush=True)
        sys.argv = [str(script)]
        runpy.run_path(str(script), run_name="__main__")
    runpy.run_path(str(REPO_ROOT / "benchmarks" / "plot_results.py"), run_name="__main__")
    return 0


def _check(args: argparse.Namespace, rest: list[str]) -> int:
    from verl_vllm_rm.parity.check import run_check

    report = run_check(args.url, args.model, probes=args.probes, threshold=args.threshold, api_key=args.api_key,
                       zero_norm=args.zero_norm, identical_tol=args.identical_tol)
    print(json.dumps(report, indent=2))
    print("check: OK" if report["ok"] else "check: FAILED", file=sys.stderr)
    return 0 if report["ok"] else 1


def _report(args: argparse.Namespace, rest: list[str]) -> int:
    from verl_vllm_rm.monitor.report import ReportError, write_report

    try:
        png, text = write_report(args.run_dir, args.out)
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"\nplot: {png}\nsummary: {png.with_name('report.txt')}")
    return 0


def _reference_docs(args: argparse.Namespace, rest: list[str]) -> int:
    from pathlib import Path

    from verl_vllm_rm.dev.reference_docs.pages import write_or_check

    return write_or_check(build_parser, Path(args.root), check=args.check)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-vllm-rm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", help="start the reward server (all further flags go to `python -m verl_vllm_rm.server`)"
    )
    serve.add_argument("--server-python", help="python of the server environment (default: ./.venv-server)")
    serve.set_defaults(func=_serve, passthrough=True)
    score = sub.add_parser("score", help="score texts (arguments or stdin lines) on a running server")
    score.add_argument("text", nargs="*", help="texts to score (none: one per line from stdin)")
    score.add_argument("--url", default=DEFAULT_SERVER_URL, help="the reward server (default: %(default)s)")
    score.add_argument("--normalize", action="store_true", help="sigmoid instead of the raw logit")
    score.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                       help=f"the server's API key (default: ${API_KEY_ENV})")
    score.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default: %(default)s)")
    score.set_defaults(func=_score, passthrough=False)
    check = sub.add_parser("check", help="refit parity, embedding health and max_model_len (exit 1 on failure)")
    check.add_argument("--url", default=DEFAULT_SERVER_URL, help="the reward server to check (default: %(default)s)")
    check.add_argument("--model", required=True, help="the trainer-side checkpoint the server should match")
    check.add_argument("--probes", type=int, default=64,
                       help="synthetic sequences scored by both the server and the model (default: %(default)s)")
    check.add_argument("--threshold", type=float, default=1.05, help="max mean(exp|diff|)")
    check.add_argument("--zero-norm", type=float, default=1e-6, help="embedding rows at or below this norm")
    check.add_argument("--identical-tol", type=float, default=0.0, help="rows equal within this are identical")
    check.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                       help=f"the server's API key (default: ${API_KEY_ENV})")
    check.set_defaults(func=_check, passthrough=False)
    report = sub.add_parser("report", help="after a run: one PNG (reward components, RM health, alarms over "
                            "steps) and a text summary, from verl's metrics file and rollout dump")
    report.add_argument("run_dir", help="holds verl's metrics file (metrics.jsonl: trainer.logger with file and "
                        "VERL_FILE_LOGGER_PATH) and the rollout dump (trainer.rollout_data_dir, rollouts/ or here)")
    report.add_argument("--out", help="where report.png and report.txt go (default: RUN_DIR)")
    report.set_defaults(func=_report, passthrough=False)
    demo = sub.add_parser("demo", help="the whole loop on CPU: train a tiny RM, serve it, run verl's main_ppo "
                          "GRPO with vllm_rm while the RM trains online")
    demo.add_argument("--workdir", help="where the tiny models go (default: a new temporary directory)")
    demo.add_argument("--train-seconds", type=float, default=60.0,
                      help="seconds of offline training for the tiny RM (default: %(default)s)")
    demo.add_argument("--steps", type=int, default=10, help="GRPO steps of main_ppo")
    demo.add_argument("--seed", type=int, default=0, help="seed of the models, data and run (default: %(default)s)")
    demo.set_defaults(func=_demo, passthrough=False)
    bench = sub.add_parser("bench", help="run benchmarks/bench_*.py (JSON and summary.png into benchmarks/results/)")
    bench.add_argument("--only", nargs="*", help="substrings of benchmark names to run")
    bench.set_defaults(func=_bench, passthrough=False)
    ppo = sub.add_parser("tiny-ppo", help="verl's real main_ppo GRPO with vllm_rm on CPU (tiny policy, any RM); "
                         "further arguments after -- are Hydra overrides")
    ppo.add_argument("--steps", type=int, default=8, help="GRPO steps of main_ppo (default: %(default)s)")
    ppo.add_argument("--rm", help="reward model dir (default: the tiny RM, built and trained offline)")
    ppo.add_argument("--online", default="off", choices=["off", "head_only", "lora", "full"],
                     help="train the RM during the run and publish it into the server after every step; each "
                     "prompt group's preference pair comes from the first of these that varies in the group: "
                     f"{', '.join(PAIR_SOURCES)} (the run's total reward, which varies whatever the RM's tokenizer)")
    ppo.add_argument("--work-dir", help="models, data, logs, rollouts, summary.json (default: a new temp dir)")
    ppo.add_argument("--server-url", help="use this running reward server instead of starting one")
    ppo.add_argument("--replicas", type=int, default=0,
                     help="serve the RM on N replicas the plugin starts on verl's Ray cluster (reward_kwargs.replicas)")
    ppo.add_argument("--seed", type=int, default=0,
                     help="seed of the tiny models, the data and the run (default: %(default)s)")
    ppo.add_argument("--mode", default="sync", choices=list(BASE_MODES),
                     help="verl's trainer mode: sync, or an asynchronous one (generation runs ahead of training; "
                     "separate_async on a rollout replica of its own, synced over the CPU harness's cpu_gloo "
                     "checkpoint engine) (default: %(default)s)")
    ppo.set_defaults(func=_tiny_ppo, passthrough=True)
    tiny = sub.add_parser("tiny-rm", help="build the offline tiny reward model used by tests and the demo")
    tiny.add_argument("out", help="output directory")
    tiny.set_defaults(func=_tiny_rm, passthrough=False)
    docs = sub.add_parser("reference-docs", help="write docs/reference/ (configuration, command line, error messages) "
                          "from the option dataclasses, the parsers and the raise statements")
    docs.add_argument("--check", action="store_true",
                      help="write nothing: exit 1 naming each page that differs from what would be written")
    docs.add_argument("--root", default=".", help="the repository checkout the pages go under (default: %(default)s)")
    docs.set_defaults(func=_reference_docs, passthrough=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not args.passthrough:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args, rest)


if __name__ == "__main__":
    sys.exit(main())
