"""Refit parity between the trainer-side transformers model and the vLLM server.

Reports max |diff|, mean |diff| and the multiplicative error ``mean(exp(|diff|))``
(the measure used for log-prob consistency between training and inference
engines; default threshold 1.05), plus batch-size invariance (the same probes
scored in batches of 1, 8 and 32) and repeat determinism.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict, dataclass
from typing import Sequence

from verl_vllm_rm.client.reward_client import VLLMRewardClient


@dataclass(frozen=True)
class ParityReport:
    probes: int
    max_abs_diff: float
    mean_abs_diff: float
    mult_error: float
    batch_invariance_max_diff: float
    repeat_max_diff: float
    threshold: float
    invariance_tolerance: float
    max_abs_bound: float | None = None  # the compute precision's bound on max |diff| (ParityProbe), if any

    @property
    def ok(self) -> bool:
        return (
            self.mult_error <= self.threshold
            and (self.max_abs_bound is None or self.max_abs_diff <= self.max_abs_bound)
            and self.batch_invariance_max_diff <= self.invariance_tolerance
            and self.repeat_max_diff <= self.invariance_tolerance
        )

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def compare(reference: Sequence[float], served: Sequence[float]) -> tuple[float, float, float]:
    """(max |diff|, mean |diff|, mean(exp|diff|)) of two equally long score lists."""
    if len(reference) != len(served) or not reference:
        raise ValueError(f"parity compares score lists item by item: need two non-empty lists of equal length "
                         f"(one reference score per probe), got {len(reference)} and {len(served)}")
    diffs = [abs(a - b) for a, b in zip(reference, served)]
    return max(diffs), sum(diffs) / len(diffs), sum(math.exp(d) for d in diffs) / len(diffs)


async def _served_scores(client: VLLMRewardClient, probes: list[list[int]], batch_sizes: Sequence[int]):
    runs = {}
    for size in batch_sizes:
        chunks = [probes[i : i + size] for i in range(0, len(probes), size)]
        runs[size] = [s for chunk in chunks for s in await client.score_batch(chunk)]
    repeat = await client.score_batch(probes)
    return runs, repeat


def refit_parity(
    client: VLLMRewardClient,
    reference_scores: Sequence[float],
    probes: list[list[int]],
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    threshold: float = 1.05,
    invariance_tolerance: float = 1e-4,
    max_abs_bound: float | None = None,
) -> ParityReport:
    """Score ``probes`` on the server and compare with ``reference_scores`` (the trainer's model)."""

    async def run():
        try:
            return await _served_scores(client, probes, batch_sizes)
        finally:
            await client.close()

    runs, repeat = asyncio.run(run())
    first = runs[batch_sizes[0]]
    max_diff, mean_diff, mult = compare(reference_scores, first)
    invariance = max(compare(first, runs[size])[0] for size in batch_sizes)
    return ParityReport(
        probes=len(probes),
        max_abs_diff=max_diff,
        mean_abs_diff=mean_diff,
        mult_error=mult,
        batch_invariance_max_diff=invariance,
        repeat_max_diff=compare(first, repeat)[0],
        threshold=threshold,
        invariance_tolerance=invariance_tolerance,
        max_abs_bound=max_abs_bound,
    )
