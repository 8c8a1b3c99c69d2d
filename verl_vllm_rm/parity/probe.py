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
from typing import Sequence

import torch

from verl_vllm_rm.parity.report import ParityReport, refit_parity
from verl_vllm_rm.parity.reference import sequence_scores

logger = logging.getLogger(__name__)


class ParityError(RuntimeError):
    """The server serves the new version but does not score like the trainer's model."""

    def __init__(self, message: str, report: ParityReport):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class ParityProbe:
    """Run after every ``every``-th publish; ``threshold`` bounds ``mean(exp|diff|)``."""

    every: int = 1
    threshold: float = 1.05
    invariance_tolerance: float = 1e-4
    max_probes: int = 16

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"parity probe 'every' must be >= 1, got {self.every}")
        if self.threshold < 1.0:
            raise ValueError(f"parity threshold bounds mean(exp|diff|) >= 1, got {self.threshold}")
        if self.max_probes < 1:
            raise ValueError(f"parity probe 'max_probes' must be >= 1, got {self.max_probes}")

    def due(self, publish_count: int) -> bool:
        return publish_count % self.every == 0

    def reference_scores(self, model: torch.nn.Module, probes: Sequence[Sequence[int]]) -> list[float]:
        """The trainer model's scores, one unpadded sequence at a time, in eval mode."""
        was_training = model.training
        model.eval()
        try:
            return sequence_scores(model, probes[: self.max_probes])
        finally:
            model.train(was_training)

    def compare(self, reference: Sequence[float], probes: Sequence[Sequence[int]], server_url: str,
                api_key: str | None, version: int) -> ParityReport:
        """Score ``probes`` on the server and compare; logs the figures, raises :class:`ParityError`."""
        from verl_vllm_rm.scoring.client import VLLMRewardClient

        probes = [list(ids) for ids in probes[: self.max_probes]]
        client = VLLMRewardClient(server_url, api_key=api_key, max_retries=1, deadline_s=120.0)
        report = refit_parity(client, reference, probes, batch_sizes=(len(probes),), threshold=self.threshold,
                              invariance_tolerance=self.invariance_tolerance)
        figures = report.as_dict()
        logger.info("parity after publishing version %d: %s", version, figures)
        if not report.ok:
            raise ParityError(
                f"after publishing version {version} the server does not score like the trainer's model: "
                f"max |diff| {report.max_abs_diff:.3g}, mean |diff| {report.mean_abs_diff:.3g}, "
                f"mean(exp|diff|) {report.mult_error:.4f} (threshold {self.threshold}), repeat diff "
                f"{report.repeat_max_diff:.3g}. Check that training_mode covers every tensor that trains "
                "(a backbone that trains while only the head is published drifts) and that server and "
                "trainer use the same dtype.",
                report,
            )
        return report
