"""A sustained scoring run through the ``vllm_rm`` manager, in a process of its own.

Run by ``test_fault_tolerance.py`` as a subprocess so that its memory figures are the
scoring process's alone (no pytest, no transformers reference model). It scores
``--samples`` GRPO rows step by step the way verl's reward loop does (one
``run_single`` per row, all rows of a step concurrently), samples RSS after each
step, saves the reward the trainer would see for every row (``--out``, .npy) and
prints one JSON line of figures.

Usage: python tests/support/sustained_run.py URL TINY_RM_PATH --out scores.npy [--samples 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import sys
import time

import numpy as np

GROUP_SIZE = 8
GROUPS_PER_STEP = 50  # 400 rows per step: 25 steps for 10,000 samples
FIRST_ID, VOCAB = 5, 1000  # the tiny RM's 5 special tokens come first


def step_groups(step: int) -> list[tuple[list[int], list[list[int]]]]:
    """Deterministic short (prompt ids, response ids) groups of one step; distinct across steps."""
    rng = np.random.default_rng([1234, step])
    groups = []
    for _ in range(GROUPS_PER_STEP):
        prompt = rng.integers(FIRST_ID, VOCAB, int(rng.integers(8, 17))).tolist()
        responses = [rng.integers(FIRST_ID, VOCAB, int(rng.integers(4, 25))).tolist() for _ in range(GROUP_SIZE)]
        groups.append((prompt, responses))
    return groups


def all_rows(n_steps: int) -> list[list[int]]:
    """Every row's RM input (prompt + response ids) in scoring order."""
    return [p + r for s in range(n_steps) for p, rs in step_groups(s) for r in rs]


def rss_mib() -> float:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=10_000)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from verl_vllm_rm.dev.grpo_batch import Group, build_batch
    from verl_vllm_rm.dev.loader import load_manager

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    mgr = load_manager(tokenizer, args.url, args.model, {"num_examine": 0})
    n_steps = -(-args.samples // (GROUP_SIZE * GROUPS_PER_STEP))
    scores = np.full(n_steps * GROUP_SIZE * GROUPS_PER_STEP, np.nan)
    rss: list[float] = []

    async def score_step(data) -> list[dict]:  # verl's RewardLoopWorker.compute_score_batch
        return await asyncio.gather(*(mgr.run_single(data[i : i + 1]) for i in range(len(data))))

    t0, row = time.monotonic(), 0
    for step in range(n_steps):
        data = build_batch([Group(p, rs) for p, rs in step_groups(step)], tokenizer.pad_token_id)
        outputs = mgr.loop.run_until_complete(score_step(data))
        tensor = mgr.assemble_rm_scores(data, [o["reward_score"] for o in outputs])
        scores[row : row + len(data)] = tensor.sum(dim=1).numpy()  # the score sits at one token
        row += len(data)
        rss.append(rss_mib())
    wall = time.monotonic() - t0
    mgr.close()
    np.save(args.out, scores)
    warm, mid = max(1, n_steps // 5) - 1, n_steps // 2 - 1  # RSS after 20% / 50% of the steps
    print(json.dumps({
        "samples": len(scores), "steps": n_steps, "wall_s": round(wall, 2), "samples_per_s": round(len(scores) / wall, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_after_warmup_mib": round(rss[warm], 1), "rss_mid_mib": round(rss[mid], 1), "rss_end_mib": round(rss[-1], 1),
        "growth_after_warmup_mib": round(rss[-1] - rss[warm], 1), "growth_second_half_mib": round(rss[-1] - rss[mid], 1),
        "failed": mgr.failed, "requests": mgr.rm.batcher.requests_sent,
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
