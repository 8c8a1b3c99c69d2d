"""Reward composition config: which components, their weights and parameters.

Built from a plain dict (``reward.reward_kwargs.rewards`` in a verl run) with
``RewardConfig.from_dict``, which rejects anything it does not understand with a
message naming the valid choices: a typo in a reward config otherwise trains a
policy on the wrong objective without any error.

Components:

* ``rubric``: the reward model's score (supplied by the manager);
* ``verifiable``: verl's ``compute_score`` result (supplied by the manager);
* ``judge``: a generative judge's score in [-1, 1] of the response within its prompt group
  (supplied by the manager from ``reward_kwargs.judge``);
* ``format``, ``length``, ``thought_length``, ``ngram``: rule rewards computed
  here (``compose.compute_rule_rewards``);
* ``gallery:<name>``: any point-wise rm-gallery reward by registry name, with
  constructor parameters under ``gallery: {<name>: {...}}``.

``total = sum(weights[c] * c for c in components) * prod(g for g in gate)``: a
``gate`` component is computed but not weighted; it multiplies the weighted sum
(e.g. a 0/1 correctness gate on the reward model's score).

An empty composition (``rewards: {}``) mirrors RM-Gallery's post-training recipe (docs/tutorial/
rm_application/post_training.md: ``0.95 * rubric + 0.05 * format +
total_length + ngram``, n-gram penalty with ``ngram_size=5, max_penalty=-1.0,
min_scaling=0.1``; the recipe computes the thought-length reward for logging
only, so ``thought_length`` is off by default). An enabled component without an
explicit weight gets its recipe weight: 0.95 for ``rubric``, 0.05 for
``format``, 1.0 for every other one. Without ``rewards`` at all, the manager's
``combine`` decides, and its default ``replace`` is the RM score alone.

Example::

    {"components": ["verifiable", "format", "ngram"],
     "weights": {"verifiable": 1.0, "format": 0.1},
     "ngram": {"ngram_size": 4}}

The manager's ``combine``/``alpha`` options are a shorthand for compositions of
``rubric`` and ``verifiable`` (``from_combine``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping, get_args

from verl_vllm_rm.options import build, inline
from verl_vllm_rm.rewards.format import format_checker
from verl_vllm_rm.rewards.gallery import PREFIX as GALLERY_PREFIX
from verl_vllm_rm.rewards.length import check_band, check_overlong
from verl_vllm_rm.rewards.ngram import check_ngram_params

EXTERNAL_COMPONENTS = ("rubric", "verifiable", "judge")
RULE_COMPONENTS = ("format", "length", "thought_length", "ngram")
DEFAULT_COMPONENTS = ("rubric", "format", "length", "ngram")
RECIPE_WEIGHTS = MappingProxyType({"rubric": 0.95, "format": 0.05})
CombineMode = Literal["replace", "add", "multiply", "weighted"]


@dataclass(frozen=True)
class FormatParams:
    """See ``format.py``: ordered ``<tag>...</tag>`` blocks, or a regex that replaces them."""

    blocks: tuple[str, ...] = ("think", "answer")
    """The tags whose ``<tag>...</tag>`` blocks must appear, in this order."""
    pattern: str | None = None
    """A regex the whole response must match, instead of ``blocks``."""

    def __post_init__(self) -> None:
        format_checker(self.blocks, self.pattern)
        object.__setattr__(self, "blocks", tuple(self.blocks))


@dataclass(frozen=True)
class BandParams:
    """Token band ``[min_tokens, max_tokens]`` and the penalty per token outside it."""

    min_tokens: int = 0
    """Fewest tokens without a penalty."""
    max_tokens: int | None = None
    """Most tokens without a penalty; unset: no upper bound."""
    penalty_per_token: float = 0.01
    """Penalty per token outside the band."""

    def __post_init__(self) -> None:
        check_band(self.min_tokens, self.max_tokens, self.penalty_per_token)


@dataclass(frozen=True)
class LengthParams:
    """Total length: band plus DAPO's overlong penalty (off while ``overlong_buffer`` is 0)."""

    band: BandParams = inline(BandParams)
    """The token band and its penalty (``min_tokens``, ``max_tokens``, ``penalty_per_token``)."""
    max_response_tokens: int | None = None
    """DAPO's overlong penalty: the response length limit it counts back from."""
    overlong_buffer: int = 0
    """DAPO's overlong penalty: the tokens before ``max_response_tokens`` over which it grows (0: off)."""
    overlong_penalty_factor: float = 1.0
    """DAPO's overlong penalty: its value at ``max_response_tokens``."""

    def __post_init__(self) -> None:
        check_overlong(self.max_response_tokens, self.overlong_buffer, self.overlong_penalty_factor)


@dataclass(frozen=True)
class ThoughtLengthParams:
    """Thought length: band on the tokens between the think tags (see ``spans.py``)."""

    band: BandParams = inline(BandParams)
    """The token band and its penalty (``min_tokens``, ``max_tokens``, ``penalty_per_token``)."""
    open_tag: str = "<think>"
    """The tag that opens the thought."""
    close_tag: str = "</think>"
    """The tag that closes the thought."""

    def __post_init__(self) -> None:
        for tag in (self.open_tag, self.close_tag):
            if not isinstance(tag, str) or not tag:
                raise ValueError(f"open_tag and close_tag must be non-empty strings, got {tag!r}")


@dataclass(frozen=True)
class NgramParams:
    """See ``ngram.py`` for the exact formula."""

    ngram_size: int = 5
    """Tokens per n-gram."""
    max_penalty: float = -1.0
    """The penalty of a response that repeats one n-gram throughout."""
    min_scaling: float = 0.1
    """Repetition rate below which there is no penalty; the penalty grows linearly from it to 1."""

    def __post_init__(self) -> None:
        check_ngram_params(self.ngram_size, self.max_penalty, self.min_scaling)


_VALID_COMPONENTS = (*EXTERNAL_COMPONENTS, *RULE_COMPONENTS, f"{GALLERY_PREFIX}<name>")


def _check_component(name: Any) -> None:
    if isinstance(name, str) and (name in EXTERNAL_COMPONENTS or name in RULE_COMPONENTS):
        return
    if isinstance(name, str) and name.startswith(GALLERY_PREFIX) and name[len(GALLERY_PREFIX):].strip():
        return
    raise ValueError(f"unknown reward component {name!r}; valid: {', '.join(_VALID_COMPONENTS)} "
                     f"(<name> is an rm-gallery registry name, e.g. {GALLERY_PREFIX}reasoning_format)")


def _check_weight(name: str, weight: Any) -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"weight of {name!r} must be a finite number, got {weight!r}")
    return float(weight)


def _check_names(key: str, names: tuple[str, ...]) -> None:
    for name in names:
        _check_component(name)
    duplicates = sorted({c for c in names if names.count(c) > 1})
    if duplicates:
        raise ValueError(f"{key} lists {duplicates} more than once")


@dataclass(frozen=True)
class RewardConfig:
    """Validated composition config. Build it with ``from_dict``; the defaults are the RM-Gallery recipe.

    Plain dataclasses, dicts and tuples only, so it pickles into Ray workers. ``weights``
    holds one resolved weight per component of ``components``; ``gate`` components multiply
    the weighted sum.
    """

    components: tuple[str, ...] = DEFAULT_COMPONENTS
    """The weighted components: ``rubric``, ``verifiable``, ``judge``, ``format``, ``length``, ``thought_length``,
    ``ngram``, ``gallery:<name>``."""
    weights: Mapping[str, float] = field(default_factory=dict)
    """Weight per component; a component without one gets its recipe weight (0.95 ``rubric``, 0.05 ``format``, else
    1.0)."""
    gate: tuple[str, ...] = ()
    """Components computed but not weighted: each multiplies the weighted sum (e.g. a 0/1 correctness gate)."""
    format: FormatParams = field(default_factory=FormatParams)
    """Parameters of the ``format`` component."""
    length: LengthParams = field(default_factory=LengthParams)
    """Parameters of the ``length`` component (total response tokens)."""
    thought_length: ThoughtLengthParams = field(default_factory=ThoughtLengthParams)
    """Parameters of the ``thought_length`` component (tokens inside the think block)."""
    ngram: NgramParams = field(default_factory=NgramParams)
    """Parameters of the ``ngram`` repetition penalty (over response token ids)."""
    gallery: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Constructor parameters of each ``gallery:<name>`` component, by registry name."""

    def __post_init__(self) -> None:
        components, gate = tuple(self.components), tuple(self.gate)
        if not components or isinstance(self.components, str):
            raise ValueError(f"components must be a non-empty list of names, got {self.components!r}")
        if isinstance(self.gate, str):
            raise ValueError(f"gate must be a list of names, got {self.gate!r}; a string is not read as one name: "
                             f"give [{self.gate!r}]")
        _check_names("components", components)
        _check_names("gate", gate)
        both = [c for c in gate if c in components]
        if both:
            raise ValueError(f"{both} are in both components and gate: a component is either weighted "
                             "(components) or multiplies the weighted sum (gate); keep it in one of them")
        not_enabled = [name for name in self.weights if name not in components]
        if not_enabled:
            raise ValueError(f"weights gives weights for {not_enabled}, which are not enabled "
                             f"(components: {list(components)}); add them to components or drop the weights"
                             + (" (gate components are not weighted)" if set(not_enabled) & set(gate) else ""))
        weights = {c: _check_weight(c, self.weights.get(c, RECIPE_WEIGHTS.get(c, 1.0))) for c in components}
        object.__setattr__(self, "components", components)
        object.__setattr__(self, "gate", gate)
        object.__setattr__(self, "weights", weights)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> RewardConfig:
        """Validate a plain dict (or OmegaConf DictConfig); ``None`` or ``{}`` gives the recipe default."""
        return build(cls, raw, "rewards")

    @classmethod
    def from_combine(cls, mode: CombineMode, alpha: float) -> RewardConfig:
        """The composition the manager's ``combine``/``alpha`` shorthand stands for.

        ``replace``: the RM score alone (``compute_score`` is not called); ``add``: rm +
        verifiable; ``weighted``: alpha * rm + (1 - alpha) * verifiable; ``multiply``: rm
        gated by verifiable (rm * verifiable).
        """
        if mode == "replace":
            return cls(components=("rubric",), weights={"rubric": 1.0})
        if mode == "add":
            return cls(components=("rubric", "verifiable"), weights={"rubric": 1.0, "verifiable": 1.0})
        if mode == "weighted":
            return cls(components=("rubric", "verifiable"), weights={"rubric": alpha, "verifiable": 1.0 - alpha})
        if mode == "multiply":
            return cls(components=("rubric",), weights={"rubric": 1.0}, gate=("verifiable",))
        raise ValueError(f"combine={mode!r} is not one of {list(get_args(CombineMode))}")

    @property
    def enabled(self) -> tuple[str, ...]:
        """Every component to compute: the weighted ones, then the gate."""
        return self.components + self.gate

    @property
    def gallery_names(self) -> tuple[str, ...]:
        """Registry names of the enabled ``gallery:`` components, in order."""
        return tuple(c[len(GALLERY_PREFIX):] for c in self.enabled if c.startswith(GALLERY_PREFIX))
