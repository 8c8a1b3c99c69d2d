"""Options of the generative judge: ``reward.reward_kwargs.judge``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.options import check_ranges
from verl_vllm_rm.rewards.judge import DEFAULT_PRINCIPLES, Aggregation, JudgeMode, check_template

FailurePolicy = Literal["raise", "mask"]
PairwiseAgainst = Literal["reference", "group"]


@dataclass(frozen=True)
class JudgeOptions(ClientOptions):
    """A generative judge: where it is served (the client options) and how it judges."""

    mode: JudgeMode = "listwise"
    principles: list[str] = field(default_factory=lambda: list(DEFAULT_PRINCIPLES))
    template: str | None = None  # None: the mode's DEFAULT_TEMPLATES entry
    pairwise_against: PairwiseAgainst = "reference"
    aggregation: Aggregation = "winrate"  # pairwise among the group's members
    max_tokens: int = 128
    temperature: float = 0.0
    failure_policy: FailurePolicy = "raise"  # mask: a failed judgement masks its samples (judge_valid 0)
    group_size: int | None = None  # members per prompt group; None: actor_rollout_ref.rollout.n (val_kwargs.n)
    group_timeout_s: float = 600.0  # a group not complete this long after its first member fails

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.template is not None:
            check_template(self.mode, self.template)
        check_ranges(self, {"> 0": ("max_tokens",), ">= 0": ("temperature",), ">= 1": ("group_size",)},
                     prefix="judge ")
        check_ranges(self, {"> 0": ("group_timeout_s",)})
