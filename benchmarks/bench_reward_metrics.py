"""Cost of trainer mode ``vllm_rm``'s per-step reward metrics and alarms, beside verl's own per-step data metrics.

    .venv/bin/python benchmarks/bench_reward_metrics.py [--sizes 256 1024 4096 16384] [--group 8] [--repeats 7]

Writes ``benchmarks/results/reward_metrics.json``. For each step size (samples), in one run:

* ``ours``: what the trainer does after verl's step, minus the TransferQueue read: per-sample
  ``reward_extra_info`` dicts as the manager writes them (13 keys) -> ``StepRewards.from_rows`` ->
  ``step_metrics`` (every ``reward/*`` metric and the four per-step alarms);
* ``verl``: verl's ``compute_data_metrics`` on the same step (responses of ``--response-len`` tokens),
  which verl runs every step anyway.

Best of ``--repeats``; the ratio is ours / verl. In a real run verl logs the whole cost, TransferQueue read
included, as ``timing_s/reward_metrics``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_rule_rewards, run from anywhere
from bench_rule_rewards import machine  # noqa: E402

from verl_vllm_rm.monitor.metrics import StepRewards, step_metrics

OUT = Path(__file__).parent / "results" / "reward_metrics.json"


def step_rows(n: int, group: int, rng: np.random.Generator) -> tuple[list[str], np.ndarray, list[dict]]:
    lengths = rng.integers(16, 1024, size=n)
    rm = rng.normal(size=n)
    verifiable = rng.integers(0, 2, size=n).astype(float)
    rows = [{"score": float(rm[i] + verifiable[i]), "rm_score": float(rm[i]), "rm_valid": 1.0,
             "rm_prompt_tokens_dropped": 0.0, "rm_tokens": float(lengths[i] + 200), "rm_latency_ms": 30.0 + i % 7,
             "rm_weight_version": 3.0, "verifiable_score": float(verifiable[i]), "format": float(i % 2),
             "length": -0.001 * float(lengths[i]), "response_tokens": float(lengths[i]),
             "ngram": -0.01 * (i % 5), "pred": str(i)}
            for i in range(n)]
    return [f"uid-{i // group}" for i in range(n)], lengths, rows


def verl_batch(n: int, response_len: int, rng: np.random.Generator):
    from tensordict import TensorDict
    from verl import DataProto

    scores = torch.zeros(n, response_len)
    scores[:, -1] = torch.from_numpy(rng.normal(size=n)).float()
    mask = torch.ones(n, response_len)
    tensors = {"token_level_scores": scores, "token_level_rewards": scores.clone(),
               "advantages": torch.randn(n, response_len), "returns": torch.randn(n, response_len),
               "prompts": torch.zeros(n, 256, dtype=torch.long), "responses": torch.zeros(n, response_len, dtype=torch.long),
               "response_mask": mask, "prompt_length": torch.full((n,), 200.0),
               "response_length": torch.from_numpy(rng.integers(16, response_len, size=n)).float()}
    batch = DataProto(batch=TensorDict(tensors, batch_size=n))
    batch.non_tensor_batch["__num_turns__"] = np.full(n, 2, dtype=np.int32)
    return batch


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    from verl.trainer.ppo.metric_utils import compute_data_metrics

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    steps = []
    for n in args.sizes:
        groups, lengths, rows = step_rows(n, args.group, rng)
        batch = verl_batch(n, args.response_len, rng)
        ours = best_of(args.repeats, lambda: step_metrics(StepRewards.from_rows(groups, lengths, rows), False))
        verl = best_of(args.repeats, lambda: compute_data_metrics(batch, use_critic=False))
        steps.append({"samples": n, "ours_ms": ours * 1e3, "verl_compute_data_metrics_ms": verl * 1e3,
                      "ours_us_per_sample": ours * 1e6 / n, "ours_over_verl": ours / verl})
        print(json.dumps(steps[-1]), flush=True)
    result = {
        "benchmark": "reward_metrics",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "data": {"group_size": args.group, "response_len": args.response_len, "repeats": args.repeats,
                 "keys_per_sample": len(rows[0])},
        "steps": steps,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
