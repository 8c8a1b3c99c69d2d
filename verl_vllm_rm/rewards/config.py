"""Reward composition config: which components, their weights and parameters.

Built from a plain dict (``reward.reward_kwargs.rewards`` in a verl run) with
``RewardConfig.from_dict``, which rejects anything it does not understand with a
message naming the valid choices: a typo in a reward config otherwise trains a
policy on the wrong objective without any error.

Components:

* ``rubric``: the reward model's score (supplied by the manager);
* ``verifiable``: verl's ``compute_score`` result (supplied by the manager);
* ``format``, ``length``, ``thought_length``, ``ngram``: rule rewards computed
  here (``compose.compute_rule_rewards``);
* ``gallery:<name>``: any point-wise rm-gallery reward by registry name, with
  constructor parameters under ``gallery: {<name>: {...}}``.

The default mirrors RM-Gallery's post-training recipe (docs/tutorial/
rm_application/post_training.md: ``0.95 * rubric + 0.05 * format +
total_length + ngram``, n-gram penalty with ``ngram_size=5, max_penalty=-1.0,
min_scaling=0.1``; the recipe computes the thought-length reward for logging
only, so ``thought_length`` is off by default). An enabled component without an
explicit weight gets its recipe weight: 0.95 for ``rubric``, 0.05 for
``format``, 1.0 for every other one.

Example::

    {"components": ["verifiable", "format", "ngram"],
     "weights": {"verifiable": 1.0, "format": 0.1},
     "ngram": {"ngram_size": 4}}
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from verl_vllm_rm.rewards.format import format_checker
from verl_vllm_rm.rewards.gallery import PREFIX as GALLERY_PREFIX
from verl_vllm_rm.rewards.length import check_band, check_overlong
from verl_vllm_rm.rewards.ngram import check_ngram_params

EXTERNAL_COMPONENTS = ("rubric", "verifiable")
RULE_COMPONENTS = ("format", "length", "thought_length", "ngram")
DEFAULT_COMPONENTS = ("rubric", "format", "length", "ngram")
RECIPE_WEIGHTS = MappingProxyType({"rubric": 0.95, "format": 0.05})


@dataclass(frozen=True)
class FormatParams:
    """See ``format.py``: ordered ``<tag>...</tag>`` blocks, or a regex that replaces them."""

    blocks: tuple[str, ...] = ("think", "answer")
    pattern: str | None = None

    def __post_init__(self) -> None:
        format_checker(self.blocks, self.pattern)
        object.__setattr__(self, "blocks", tuple(self.blocks))


@dataclass(frozen=True)
class BandParams:
    """Token band ``[min_tokens, max_tokens]`` and the penalty per token outside it."""

    min_tokens: int = 0
    max_tokens: int | None = None
    penalty_per_token: float = 0.01

    def __post_init__(self) -> None:
        check_band(self.min_tokens, self.max_tokens, self.penalty_per_token)


@dataclass(frozen=True)
class LengthParams(BandParams):
    """Total length: band plus DAPO's overlong penalty (off while ``overlong_buffer`` is 0)."""

    max_response_tokens: int | None = None
    overlong_buffer: int = 0
    overlong_penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_overlong(self.max_response_tokens, self.overlong_buffer, self.overlong_penalty_factor)


@dataclass(frozen=True)
class ThoughtLengthParams(BandParams):
    """Thought length: band on the tokens between the think tags (see ``spans.py``)."""

    open_tag: str = "<think>"
    close_tag: str = "</think>"

    def __post_init__(self) -> None:
        super().__post_init__()
        for tag in (self.open_tag, self.close_tag):
            if not isinstance(tag, str) or not tag:
                raise ValueError(f"open_tag and close_tag must be non-empty strings, got {tag!r}")


@dataclass(frozen=True)
class NgramParams:
    """See ``ngram.py`` for the exact formula."""

    ngram_size: int = 5
    max_penalty: float = -1.0
    min_scaling: float = 0.1

    def __post_init__(self) -> None:
        check_ngram_params(self.ngram_size, self.max_penalty, self.min_scaling)


_SECTIONS = {"format": FormatParams, "length": LengthParams, "thought_length": ThoughtLengthParams,
             "ngram": NgramParams}
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


def _section(key: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        raise ValueError(f"rewards.{key} must be a mapping of parameters, got {type(raw).__name__}")
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ValueError(f"rewards.{key}: unknown parameter(s) {unknown}; valid: {', '.join(valid)}")
    try:
        return cls(**raw)
    except ValueError as exc:
        raise ValueError(f"rewards.{key}: {exc}") from exc


@dataclass(frozen=True)
class RewardConfig:
    """Validated composition config. Build it with ``from_dict``; the defaults are the RM-Gallery recipe.

    Plain dataclasses, dicts and tuples only, so it pickles into Ray workers. ``weights``
    holds one resolved weight per enabled component.
    """

    components: tuple[str, ...] = DEFAULT_COMPONENTS
    weights: Mapping[str, float] = field(default_factory=dict)
    format: FormatParams = field(default_factory=FormatParams)
    length: LengthParams = field(default_factory=LengthParams)
    thought_length: ThoughtLengthParams = field(default_factory=ThoughtLengthParams)
    ngram: NgramParams = field(default_factory=NgramParams)
    gallery: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        components = tuple(self.components)
        if not components or isinstance(self.components, str):
            raise ValueError(f"rewards.components must be a non-empty list of names, got {self.components!r}")
        for name in components:
            _check_component(name)
        duplicates = sorted({c for c in components if components.count(c) > 1})
        if duplicates:
            raise ValueError(f"rewards.components lists {duplicates} more than once")
        not_enabled = [name for name in self.weights if name not in components]
        if not_enabled:
            raise ValueError(f"rewards.weights gives weights for {not_enabled}, which are not enabled "
                             f"(components: {list(components)}); add them to rewards.components or drop the weights")
        weights = {c: _check_weight(c, self.weights.get(c, RECIPE_WEIGHTS.get(c, 1.0))) for c in components}
        object.__setattr__(self, "components", components)
        object.__setattr__(self, "weights", weights)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> RewardConfig:
        """Validate a plain dict (or OmegaConf DictConfig); ``None`` or ``{}`` gives the recipe default."""
        raw = dict(raw or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(valid))
        if unknown:
            raise ValueError(f"rewards: unknown key(s) {unknown}; valid: {', '.join(valid)}")
        components = raw.get("components", DEFAULT_COMPONENTS)
        if isinstance(components, str) or not isinstance(components, Sequence):
            raise ValueError(f"rewards.components must be a list of component names, got {components!r}")
        weights = raw.get("weights") or {}
        if not isinstance(weights, Mapping):
            raise ValueError(f"rewards.weights must map component names to weights, got {weights!r}")
        gallery = raw.get("gallery") or {}
        if not isinstance(gallery, Mapping) or not all(isinstance(p, Mapping) for p in gallery.values()):
            raise ValueError("rewards.gallery must map rm-gallery names (without 'gallery:') to parameter mappings")
        sections = {key: _section(key, sec_cls, raw[key]) for key, sec_cls in _SECTIONS.items() if key in raw}
        return cls(
            components=tuple(components),
            weights=dict(weights),
            gallery={str(k): dict(v) for k, v in gallery.items()},
            **sections,
        )

    @property
    def gallery_names(self) -> tuple[str, ...]:
        """Registry names of the enabled ``gallery:`` components, in order."""
        return tuple(c[len(GALLERY_PREFIX):] for c in self.components if c.startswith(GALLERY_PREFIX))
