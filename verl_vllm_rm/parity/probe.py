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
from typing import Any, Callable, Sequence

import torch

from verl_vllm_rm.options import check_ranges
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
        check_ranges(self, {">= 1": ("every", "max_probes")}, prefix="parity probe ")
        if self.threshold < 1.0:
            raise ValueError(f"parity threshold bounds mean(exp|diff|) >= 1, got {self.threshold}")

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
              agree: Callable[[Exception | None], None]) -> dict[str, dict[str, Any]]:
        """The parity check after a publish: the model's reference scores once (on every rank of a distributed
        trainer: a sharded forward is collective), compared with each server's by the ``leader`` (rank 0);
        ``agree(error)`` lets every rank learn the leader's outcome. The figures by server URL."""
        reference = self.reference_scores(model, probe_ids)
        error, figures = None, {}
        if leader:
            try:
                for url in server_urls:
                    figures[url] = self.compare(reference, probe_ids, url, api_key, version).as_dict()
            except Exception as e:  # every rank learns it through agree
                error = e
        agree(error)
        return figures

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
        from verl_vllm_rm.client.reward_client import VLLMRewardClient

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
