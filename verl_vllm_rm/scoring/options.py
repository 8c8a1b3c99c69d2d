"""Options of the ``vllm_rm`` reward manager, read from ``reward.reward_kwargs``.

Every option is a typed dataclass field with a default; an unknown key or a value
of the wrong type is an error that lists the valid options, so a typo in a Hydra
override fails at start-up instead of silently using a default.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from verl_vllm_rm.scoring.pairwise import validate_reference_source
from verl_vllm_rm.scoring.rm_inputs import check_rubric_template

InputFormat = Literal["token_ids", "chat_template"]
OverlongPolicy = Literal["truncate_prompt_left", "error"]
FailurePolicy = Literal["raise", "mask"]
CombineMode = Literal["replace", "add", "multiply", "weighted"]
PairwiseMode = Literal["auto", "always", "never"]
MissingReference = Literal["raise", "skip"]


class ConfigError(ValueError):
    """A bad ``reward.reward_kwargs`` entry; the message names the fix."""


@dataclass(frozen=True)
class ClientOptions:
    """How the trainer talks to the reward server(s)."""

    server_url: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8001"])
    api_key: str | None = None
    model: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    request_timeout_s: float = 300.0
    deadline_s: float = 900.0
    max_retries: int = 4
    backoff_base_s: float = 0.25
    backoff_max_s: float = 8.0
    max_concurrent_requests: int = 8
    max_batch_seqs: int = 256
    max_batch_tokens: int = 131072
    endpoint_cooldown_s: float = 5.0


@dataclass(frozen=True)
class ManagerOptions(ClientOptions):
    """All options of ``reward.reward_manager.name=vllm_rm`` (see README, "Configuration")."""

    input_format: InputFormat = "token_ids"
    rm_tokenizer_path: str | None = None
    max_length: int | None = None
    overlong_policy: OverlongPolicy = "truncate_prompt_left"
    failure_policy: FailurePolicy = "raise"
    combine: CombineMode = "replace"
    alpha: float = 0.5
    normalize: bool = False
    coalesce_ms: float = 5.0
    num_examine: int = 1
    rubric_template: str | None = None
    rubric_principles: list[str] = field(default_factory=lambda: ["helpfulness", "harmlessness", "honesty"])
    rewards: dict | None = None
    pairwise: PairwiseMode = "auto"
    reference_source: str = "ground_truth"
    missing_reference: MissingReference = "raise"

    def client_options(self) -> ClientOptions:
        names = {f.name for f in dataclasses.fields(ClientOptions)}
        return ClientOptions(**{n: getattr(self, n) for n in names})


_SCALARS: dict[type, tuple[str, tuple[type, ...]]] = {
    bool: ("true or false", (bool,)),
    int: ("an integer", (int,)),
    float: ("a number", (int, float)),
    str: ("a string", (str,)),
}


def _check_type(name: str, value: Any, annotation: Any) -> Any:
    """Coerce/validate one value against a (simple) annotation; returns the value to store."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_type(name, value, inner)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"reward_kwargs.{name}={value!r} is not one of {list(args)}")
        return value
    if origin is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items) or not items:
            raise ConfigError(f"reward_kwargs.{name} must be a string or a non-empty list of strings, got {value!r}")
        return list(items)
    if annotation is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"reward_kwargs.{name} must be a mapping, got {value!r}")
        return dict(value)
    if annotation in _SCALARS:
        what, accepted = _SCALARS[annotation]
        if not isinstance(value, accepted) or (annotation is not bool and isinstance(value, bool)):
            raise ConfigError(f"reward_kwargs.{name} must be {what}, got {value!r}")
        return float(value) if annotation is float else value
    raise TypeError(f"unsupported option annotation {annotation!r} for {name}")


def _validate_ranges(opts: ClientOptions) -> None:
    positive = [
        "connect_timeout_s", "read_timeout_s", "request_timeout_s", "deadline_s", "max_concurrent_requests",
        "max_batch_seqs", "max_batch_tokens",
    ]
    for name in positive:
        if getattr(opts, name) <= 0:
            raise ConfigError(f"reward_kwargs.{name} must be > 0, got {getattr(opts, name)}")
    for name in ("max_retries", "backoff_base_s", "backoff_max_s", "endpoint_cooldown_s"):
        if getattr(opts, name) < 0:
            raise ConfigError(f"reward_kwargs.{name} must be >= 0, got {getattr(opts, name)}")
    for url in opts.server_url:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"reward_kwargs.server_url entry {url!r} must start with http:// or https://")
    if isinstance(opts, ManagerOptions):
        _validate_manager(opts)


def _validate_manager(opts: ManagerOptions) -> None:
    for name in ("coalesce_ms", "num_examine"):
        if getattr(opts, name) < 0:
            raise ConfigError(f"reward_kwargs.{name} must be >= 0, got {getattr(opts, name)}")
    if opts.max_length is not None and opts.max_length <= 0:
        raise ConfigError(f"reward_kwargs.max_length must be > 0, got {opts.max_length}")
    if not 0.0 <= opts.alpha <= 1.0:
        raise ConfigError(f"reward_kwargs.alpha must be in [0, 1], got {opts.alpha}")
    try:
        validate_reference_source(opts.reference_source)
    except ValueError as e:
        raise ConfigError(f"reward_kwargs.{e}") from None
    if opts.rubric_template is not None:
        if opts.input_format == "chat_template":
            raise ConfigError("reward_kwargs.rubric_template replaces input_format=chat_template; use one of them")
        try:
            check_rubric_template(opts.rubric_template)
        except ValueError as e:
            raise ConfigError(f"reward_kwargs.{e}") from None
    if opts.rewards is not None and opts.combine != "replace":
        raise ConfigError(
            f"reward_kwargs.combine={opts.combine!r} and reward_kwargs.rewards are exclusive: with a rewards "
            "composition, put 'verifiable' in rewards.components and give it a weight"
        )
    if opts.input_format == "chat_template" and not opts.rm_tokenizer_path:
        raise ConfigError(
            "reward_kwargs.input_format=chat_template needs reward_kwargs.rm_tokenizer_path "
            "(the reward model's tokenizer, whose chat template builds the RM input)"
        )


def parse_options(raw: Mapping[str, Any] | None, cls: type = ManagerOptions) -> Any:
    """Validate a plain mapping (e.g. ``OmegaConf.to_container(config.reward.reward_kwargs)``)."""
    raw = dict(raw or {})
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ConfigError(f"unknown reward_kwargs option(s) {unknown}; valid options are: {', '.join(valid)}")
    values = {name: _check_type(name, value, hints[name]) for name, value in raw.items()}
    if "api_key" not in values and os.environ.get("VERL_VLLM_RM_API_KEY"):
        values["api_key"] = os.environ["VERL_VLLM_RM_API_KEY"]
    opts = cls(**values)
    _validate_ranges(opts)
    return opts
