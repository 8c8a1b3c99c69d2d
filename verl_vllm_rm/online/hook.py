"""The hook run after each RM step: publish the new weights into the reward server."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.weight_sync.publisher import RewardModelPublisher


class PublishAfterStep:
    """The hook run after each RM step: publish every ``every`` steps, versions counting up."""

    def __init__(self, make_publisher: Callable[[], RewardModelPublisher], mode: RewardModelTrainingMode | str,
                 every: int = 1) -> None:
        self.make_publisher = make_publisher
        self.mode = RewardModelTrainingMode.parse(mode)
        self.every = every
        self.publisher: RewardModelPublisher | None = None

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
        result = self.publisher.publish(model, self.publisher.version + 1, self.mode, probe_ids=probe_ids)
        metrics = {"rm/published_version": float(result.version), "rm/publish_s": result.seconds,
                   "rm/publish_bytes": float(result.num_bytes)}
        if result.parity is not None:
            metrics.update({f"rm/parity_{k}": float(result.parity[k])
                            for k in ("max_abs_diff", "mean_abs_diff", "mult_error")})
        return metrics
