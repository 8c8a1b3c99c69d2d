"""Options of the generative judge: ``reward.reward_kwargs.judge``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.options import check_ranges, inline
from verl_vllm_rm.rewards.judge import DEFAULT_PRINCIPLES, Aggregation, JudgeMode, check_template

FailurePolicy = Literal["raise", "mask"]
PairwiseAgainst = Literal["reference", "group"]


@dataclass(frozen=True)
class JudgeOptions:
    """A generative judge: where it is served (its client options) and how it judges."""

    client: ClientOptions = inline(ClientOptions)
    """Where the judge is served and how it is asked: ``judge.server_url``, ``judge.read_timeout_s``, ..."""
    mode: JudgeMode = "listwise"
    """``listwise``: one call per group ranks every response; ``pointwise``: a score 1-10 per response, min-max
    scaled over the group; ``pairwise``: each response against the reference or every pair of members once."""
    principles: list[str] = field(default_factory=lambda: list(DEFAULT_PRINCIPLES))
    """The numbered list put in the template's ``{principles}``."""
    template: str | None = None
    """A ``str.format`` prompt with ``{prompt}`` and ``{responses}`` (and ``{principles}``, ``{n}`` listwise); unset:
    the mode's own."""
    pairwise_against: PairwiseAgainst = "reference"
    """``mode=pairwise``: against the prompt's reference answer (from ``reference_source``) or the ``group``."""
    aggregation: Aggregation = "winrate"
    """Pairwise among members: ``winrate`` (wins / comparisons), ``copeland`` (wins - losses) or ``elo``, each scaled
    to [-1, 1]."""
    max_tokens: int = 128
    """Most tokens the judge generates per answer."""
    temperature: float = 0.0
    """The judge's sampling temperature."""
    failure_policy: FailurePolicy = "raise"
    """``raise``: the step stops naming the group and the cause; ``mask``: the group's samples get
    ``judge_valid=0`` and no reward, counted."""
    group_size: int | None = None
    """Responses per prompt group; unset: ``actor_rollout_ref.rollout.n`` (``val_kwargs.n`` in validation)."""
    group_timeout_s: float = 600.0
    """A group not complete this long (seconds) after its first member arrived fails (``failure_policy``)."""

    def __post_init__(self) -> None:
        if self.template is not None:
            check_template(self.mode, self.template)
        check_ranges(self, {"> 0": ("max_tokens",), ">= 0": ("temperature",), ">= 1": ("group_size",)},
                     prefix="judge ")
        check_ranges(self, {"> 0": ("group_timeout_s",)})
