"""Options of online RM training: ``+online_rm.*`` in a verl run (see docs/weight_sync.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from verl_vllm_rm.options import build, check_ranges
from verl_vllm_rm.parity.probe import ParityProbe
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES


@dataclass
class OnlineRMConfig:
    """Options of online RM training (``+online_rm.*`` in a verl run; see docs/weight_sync.md)."""

    model_path: str
    server_url: str | None = None  # the one server to publish to, or:
    reward_model: str | None = None  # the managed RM (reward_kwargs.replicas) whose every replica gets each publish
    training_mode: str = "head_only"
    publish_every: int = 1
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_target_modules: Any = "all-linear"
    min_reward_gap: float = 0.0
    # What ranks a group's responses (the pair source): vllm_rm's verifiable score by default; a list is tried in
    # order, per group (the first with a gap decides). "rm_scores" (the policy's reward) includes the RM's own
    # score, so the RM would learn from its own judgement there.
    reward_key: list[str] = field(default_factory=lambda: ["verifiable_score"])
    num_workers: int = 1
    use_gpu: bool = True
    api_key: str | None = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = 300.0
    parity_every: int = 0  # run the parity probe after every N publishes (0: never)
    parity_threshold: float = 1.05
    # PPO steps in a row without an RM step (no preference pairs) before the run fails (0: never): a run that asked
    # for online RM training never silently trains none
    max_idle_steps: int = 10

    def __post_init__(self) -> None:
        if (self.server_url is None) == (self.reward_model is None):
            raise ValueError("online_rm needs exactly one of server_url (one server) and reward_model (the managed "
                             f"replicas of that RM), got server_url={self.server_url!r}, "
                             f"reward_model={self.reward_model!r}")
        RewardModelTrainingMode.parse(self.training_mode)
        check_ranges(self, {">= 1": ("publish_every",), ">= 0": ("parity_every", "max_idle_steps", "min_reward_gap")})

    def parity_probe(self) -> ParityProbe | None:
        return ParityProbe(every=self.parity_every, threshold=self.parity_threshold) if self.parity_every else None

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> "OnlineRMConfig":
        """Validate the ``online_rm`` section (a mapping or DictConfig)."""
        return build(cls, options, "online_rm")
