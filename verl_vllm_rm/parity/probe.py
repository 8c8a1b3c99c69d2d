"""The refit parity probe a publisher can run after every N publishes.

After a publish the server must score exactly like the trainer's model. The probe
scores a few sequences with the trainer's model (transformers, all ranks, since a
sharded model's forward is collective) and with the server (rank 0), reports
max/mean |diff| and the multiplicative error ``mean(exp|diff|)``, logs them and
raises :class:`ParityError` above the threshold. Typical catches: a backbone that
trained while only the head was published, a LoRA scaling mismatch, a dtype
downcast the server does not share.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from verl_vllm_rm.options import check_ranges
from verl_vllm_rm.parity.report import ParityReport, refit_parity
from verl_vllm_rm.parity.reference import sequence_scores

logger = logging.getLogger(__name__)

#: Unit roundoff (half the gap from 1 to the next number) of each compute dtype.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
#: fp32 on both sides: max |server - trainer| after a publish (the project's contract; never loosened).
FP32_MAX_ABS_DIFF = 1e-4
#: bf16/fp16 on either side: max |diff| <= LOW_PRECISION_FACTOR * u * (1 + max |score| of the probes).
#: Measured on a bf16 vLLM-CPU server against the trainer's bf16 forward (verl's engine): the worst of 64 probes
#: in 8 model states reached 2.46 (benchmarks/bench_bf16_parity.py); the factor is about 3x that (the derivation
#: is in docs/weight_sync.md, "Parity per dtype").
LOW_PRECISION_FACTOR = 8.0


def coarsest(*dtypes: str) -> str:
    """The least precise of the compute dtypes (``float32``, ``bfloat16``, ``float16``)."""
    unknown = [d for d in dtypes if d not in UNIT_ROUNDOFF]
    if unknown:
        raise ValueError(f"no parity bound for dtype(s) {unknown}; known: {sorted(UNIT_ROUNDOFF)}")
    return max(dtypes, key=UNIT_ROUNDOFF.__getitem__)


def max_abs_bound(dtype: str, reference: Sequence[float]) -> float:
    """The most max |server - trainer| may be when the coarser side computes in ``dtype``."""
    if dtype == "float32":
        return FP32_MAX_ABS_DIFF
    return LOW_PRECISION_FACTOR * UNIT_ROUNDOFF[dtype] * (1.0 + max(abs(s) for s in reference))


class ParityError(RuntimeError):
    """The server serves the new version but does not score like the trainer's model."""

    def __init__(self, message: str, report: ParityReport):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class ParityProbe:
    """Run after every ``every``-th publish; ``threshold`` bounds ``mean(exp|diff|)``, and max |diff| is bounded
    by the coarser compute dtype of trainer (``compute_dtype``) and server (:func:`max_abs_bound`)."""

    every: int = 1
    threshold: float = 1.05
    compute_dtype: str = "float32"  # the trainer's forward (its mixed-precision param dtype)
    invariance_tolerance: float = 1e-4
    max_probes: int = 16

    def __post_init__(self) -> None:
        check_ranges(self, {">= 1": ("every", "max_probes")}, prefix="parity probe ")
        coarsest(self.compute_dtype)
        if self.threshold < 1.0:
            raise ValueError(f"parity probe threshold bounds mean(exp|diff|), which is 1 for equal scores and "
                             f"above 1 otherwise: set it >= 1 (1.05 by default), got {self.threshold}")

    def due(self, publish_count: int, model: Any = None, probe_ids: Sequence[Sequence[int]] | None = None) -> bool:
        """Whether the probe runs after publish number ``publish_count``; when it does, the publish must pass the
        model itself (a state dict cannot be run) and the token ids to score."""
        if publish_count % self.every:
            return False
        if not isinstance(model, torch.nn.Module) or not probe_ids:
            raise ValueError("the parity probe is due after this publish: pass the model itself (not a state "
                             "dict) and probe_ids (token ids to score)")
        return True

    def check(self, model: torch.nn.Module, probe_ids: Sequence[Sequence[int]], server_urls: Sequence[str],
              api_key: str | None, version: int, *, leader: bool,
              server_dtype: str = "float32") -> tuple[dict[str, dict[str, Any]], dict[str, Exception]]:
        """The parity check after a publish: the model's reference scores once (on every rank of a distributed
        trainer: a sharded forward is collective), compared with each server's by the ``leader`` (rank 0). The
        figures of the servers that passed, and the error of each that did not (a :class:`ParityError`, or why it
        could not be probed), by server URL; only the leader's are filled (the caller shares its outcome)."""
        reference = self.reference_scores(model, probe_ids)
        dtype = coarsest(self.compute_dtype, server_dtype)
        figures: dict[str, dict[str, Any]] = {}
        failures: dict[str, Exception] = {}
        if leader:
            for url in server_urls:
                try:
                    figures[url] = self.compare(reference, probe_ids, url, api_key, version, dtype).as_dict()
                except Exception as e:
                    failures[url] = e
        return figures, failures

    def reference_scores(self, model: torch.nn.Module, probes: Sequence[Sequence[int]]) -> list[float]:
        """The trainer model's scores, one unpadded sequence at a time, in eval mode."""
        was_training = model.training
        model.eval()
        try:
            return sequence_scores(model, probes[: self.max_probes])
        finally:
            model.train(was_training)

    def compare(self, reference: Sequence[float], probes: Sequence[Sequence[int]], server_url: str,
                api_key: str | None, version: int, dtype: str = "float32") -> ParityReport:
        """Score ``probes`` on the server and compare (``dtype``: the coarser side's compute dtype); logs the
        figures, raises :class:`ParityError`."""
        from verl_vllm_rm.client.reward_client import VLLMRewardClient

        probes = [list(ids) for ids in probes[: self.max_probes]]
        client = VLLMRewardClient(server_url, api_key=api_key, max_retries=1, deadline_s=120.0)
        reference = list(reference[: len(probes)])
        report = refit_parity(client, reference, probes, batch_sizes=(len(probes),), threshold=self.threshold,
                              invariance_tolerance=self.invariance_tolerance,
                              max_abs_bound=max_abs_bound(dtype, reference))
        figures = report.as_dict()
        logger.info("parity after publishing version %d: %s", version, figures)
        if not report.ok:
            raise ParityError(
                f"after publishing version {version} the server does not score like the trainer's model: "
                f"max |diff| {report.max_abs_diff:.3g} (bound {report.max_abs_bound:.3g} for {dtype} compute), "
                f"mean |diff| {report.mean_abs_diff:.3g}, mean(exp|diff|) {report.mult_error:.4f} (threshold "
                f"{self.threshold}), repeat diff "
                f"{report.repeat_max_diff:.3g}. Check that training_mode covers every tensor that trains "
                "(a backbone that trains while only the head is published drifts) and that server and "
                "trainer use the same dtype.",
                report,
            )
        return report
