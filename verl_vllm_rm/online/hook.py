"""The hook run after each RM step: publish the new weights into the reward server(s)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.weight_sync.multi_server import MultiServerPublisher


class PublishAfterStep:
    """The hook run after each RM step: publish every ``every`` steps, versions counting up."""

    def __init__(self, make_publisher: Callable[[], MultiServerPublisher], mode: RewardModelTrainingMode | str,
                 every: int = 1) -> None:
        self.make_publisher = make_publisher
        self.mode = RewardModelTrainingMode.parse(mode)
        self.every = every
        self.publisher: MultiServerPublisher | None = None

    def __call__(self, step: int, model: torch.nn.Module,
                 probe_ids: Sequence[Sequence[int]] | None = None) -> dict[str, float]:
        """Publish after step ``step`` when due; ``probe_ids`` feed the publisher's parity probe."""
        if step % self.every:
            return {}
        return self.publish(model, probe_ids)

    def publish(self, model: torch.nn.Module, probe_ids: Sequence[Sequence[int]] | None = None) -> dict[str, float]:
        """Publish ``model`` now, under the next version."""
        if self.publisher is None:
            self.publisher = self.make_publisher()
        results = self.publisher.publish(model, self.publisher.version + 1, self.mode, probe_ids=probe_ids)
        metrics = {"rm/published_version": float(results[0].version), "rm/publish_s": results[0].seconds,
                   "rm/publish_bytes": float(results[0].num_bytes), "rm/publish_servers": float(len(results)),
                   "rm/publish_peak_gathered_bytes": float(max(r.peak_gathered_bytes for r in results)),
                   "rm/publish_left_behind": float(len(self.publisher.left_behind))}
        if self.mode is RewardModelTrainingMode.LORA:  # the share of servers that took adapters, not merged weights
            metrics["rm/publish_lora_adapters"] = sum(r.lora_adapters for r in results) / len(results)
        checked = [r.parity for r in results if r.parity is not None]
        if checked:  # the worst server's figures
            metrics.update({f"rm/parity_{k}": max(float(p[k]) for p in checked)
                            for k in ("max_abs_diff", "mean_abs_diff", "mult_error")})
        return metrics
