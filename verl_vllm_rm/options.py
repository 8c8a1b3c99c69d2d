"""The one config validator: a mapping (or OmegaConf ``DictConfig``) checked against a dataclass, and the
one range check its sections call from ``__post_init__`` (:func:`check_ranges`).

Every option section of the package (``reward.reward_kwargs``, its ``rewards``
composition, ``+online_rm.*``) is a dataclass, as verl declares its own configs;
``build`` checks the keys and values against the fields' annotations and then
constructs the dataclass, so a typo in a Hydra override fails at start-up with a
message naming the option's path and the valid choices instead of silently
training with a default.

Why not OmegaConf structured configs (verl's ``omega_conf_to_dataclass``)? With
OmegaConf 2.3 a ``Literal`` annotation is rejected outright, "a string or a list
of strings" (a union of containers) cannot be declared, ``"3"`` is silently
converted for an ``int`` option, and an unknown key's error does not list the
valid keys. So the annotations are read here; OmegaConf input is accepted.

Supported annotations: ``bool``, ``int``, ``float`` (``bool`` is not a number; an
``int`` is stored as ``float``), ``str``, ``Any``, ``X | None``, ``Literal[...]``,
``list[S]`` (one ``S`` or a non-empty list of them), ``tuple[S, ...]``,
``dict``/``Mapping[K, V]`` and nested dataclasses (sections, checked
recursively), with ``S`` a scalar type; ``tuple[X, ...]`` also takes a list of
sections (``X`` a dataclass) or of plain mappings (``X`` is ``dict``).

Sections nest; no option class extends another. A section whose keys the user gives at its parent's level is
declared with :func:`inline` (``reward_kwargs.server_url`` fills the client section of the reward model's
options, which fills the manager's): a section for the code, flat keys for the user.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")

_SCALARS: dict[type, tuple[str, str]] = {  # type -> (one, several)
    bool: ("true or false", "booleans"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
}


class ConfigError(ValueError):
    """A bad config entry; the message names the option's path and the fix."""


#: the metadata key of a field made by :func:`inline`
INLINE = "verl_vllm_rm_inline"


def inline(section: type) -> Any:
    """A field holding a ``section`` dataclass whose options are keys of its parent's own mapping (defaults: the
    section's)."""
    return dataclasses.field(default_factory=section, metadata={INLINE: True})


def option_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    """Every option key of ``cls``, in order: each field it declares, an :func:`inline` section's in its place;
    each with the class that declares it (for its annotation and docstring)."""
    out: list[tuple[dataclasses.Field, type]] = []
    for f in dataclasses.fields(cls):
        if f.init and f.metadata.get(INLINE):
            out += option_fields(typing.get_type_hints(cls)[f.name])
        elif f.init:
            out.append((f, cls))
    return out


def flat_values(section: Any) -> dict[str, Any]:
    """A built section as the mapping it is built from: its :func:`inline` sections' keys at its own level, nested
    sections as mappings (``build(type(section), flat_values(section), path)`` builds it again)."""
    def raw(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return flat_values(value)
        if isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            return [flat_values(v) for v in value]
        return value

    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        if f.init and f.metadata.get(INLINE):
            out.update(flat_values(getattr(section, f.name)))
        elif f.init:
            out[f.name] = raw(getattr(section, f.name))
    return out


def build(cls: type[T], raw: Mapping[str, Any] | None, path: str) -> T:
    """``cls(**raw)`` after checking every key and value of ``raw`` against ``cls``'s fields.

    ``raw``: a mapping or an OmegaConf ``DictConfig`` (``None`` means no options);
    ``path``: where the section lives (``"reward_kwargs"``, ``"rewards"``, ...), the
    prefix of every message. A ``ValueError`` raised by ``cls.__post_init__`` comes
    out as a ``ConfigError`` prefixed with ``path``.
    """
    raw = _plain(raw)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path} must be {_describe(cls)}, got {raw!r}")
    valid = [f.name for f, _ in option_fields(cls)]
    unknown = sorted(str(k) for k in raw if k not in valid)
    if unknown:
        raise ConfigError(f"unknown {path} option(s) {unknown}; valid options are: {', '.join(valid)}"
                          f"{_suggestions(unknown, valid)}")
    own = [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get(INLINE)]
    missing = [f.name for f in own if f.name not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing required {path} option(s) {missing}; valid options are: {', '.join(valid)}")
    hints = typing.get_type_hints(cls)
    values = {f.name: _check(raw[f.name], hints[f.name], f"{path}.{f.name}") for f in own if f.name in raw}
    for f in dataclasses.fields(cls):
        if f.init and f.metadata.get(INLINE):
            keys = {g.name for g, _ in option_fields(hints[f.name])}
            values[f.name] = build(hints[f.name], {k: v for k, v in raw.items() if k in keys}, path)
    try:
        return cls(**values)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _plain(value: Any) -> Any:
    """OmegaConf containers as plain dicts/lists (interpolations resolved); anything else unchanged.

    OmegaConf is not imported here: a ``DictConfig`` can only exist once it has been.
    """
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(value, (omegaconf.DictConfig, omegaconf.ListConfig)):
        return omegaconf.OmegaConf.to_container(value, resolve=True)
    return value


def _suggestions(unknown: list[str], valid: list[str]) -> str:
    pairs = [(u, difflib.get_close_matches(u, valid, n=1)) for u in unknown]
    hints = [f"{match[0]!r} for {u!r}" for u, match in pairs if match]
    return f"; did you mean {', '.join(hints)}?" if hints else ""


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


def _inner(tp: Any) -> Any:
    """``X`` of ``X | None``."""
    rest = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(rest) != 1:
        raise TypeError(f"unsupported option annotation {tp!r}: only X | None unions are supported")
    return rest[0]


def _item(tp: Any) -> Any:
    """The item type of ``list[X]`` / ``tuple[X, ...]``: a scalar, or (tuples only) a dataclass or ``dict``."""
    args, origin = typing.get_args(tp), typing.get_origin(tp)
    item = args[0] if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis) else None
    if item in _SCALARS or (origin is tuple and (item is dict or dataclasses.is_dataclass(item))):
        return item
    raise TypeError(f"unsupported option annotation {tp!r}: use list[S] or tuple[S, ...] with S in "
                    f"{[t.__name__ for t in _SCALARS]}, or tuple[X, ...] with X a dataclass or dict")


def _noun(tp: Any) -> str:
    """Plural noun for the keys/values of a mapping annotation."""
    if tp in _SCALARS:
        return _SCALARS[tp][1]
    if tp is Any:
        return "values"
    if dataclasses.is_dataclass(tp):
        return f"mappings of options ({', '.join(f.name for f in dataclasses.fields(tp) if f.init)})"
    return "mappings" if tp is dict or typing.get_origin(tp) in (dict, Mapping) else _describe(tp)


def _describe(tp: Any) -> str:
    """What a value of annotation ``tp`` must be, in words (for messages)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_optional(tp):
        return f"{_describe(_inner(tp))} or null"
    if origin is Literal:
        return f"one of {list(args)}"
    if origin is list:
        item = _item(tp)  # a scalar: _item refuses any other item of a list
        return f"{_SCALARS[item][0]} or a non-empty list of {_SCALARS[item][1]}"
    if origin is tuple:
        item = _item(tp)
        return f"a list of {_SCALARS[item][1] if item in _SCALARS else _noun(item)}"
    if tp is dict or origin in (dict, Mapping):
        return f"a mapping of {_noun(args[0])} to {_noun(args[1])}" if args else "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping of options ({', '.join(f.name for f in dataclasses.fields(tp) if f.init)})"
    if tp in _SCALARS:
        return _SCALARS[tp][0]
    if tp is Any:
        return "any value"
    raise TypeError(f"unsupported option annotation {tp!r}")


def _check(value: Any, tp: Any, path: str, shown: Any = None) -> Any:
    """``value`` checked against annotation ``tp``; returns the value to store (lists of a tuple field as
    tuples, an ``int`` of a ``float`` field as ``float``, sections as dataclass instances). ``shown``: the
    annotation to name in a message (``X | None`` while ``X`` is checked)."""
    value = _plain(value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)

    def wrong() -> ConfigError:
        return ConfigError(f"{path} must be {_describe(shown or tp)}, got {value!r}")

    if tp is Any:
        return value
    if _is_optional(tp):
        return None if value is None else _check(value, _inner(tp), path, shown=tp)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}={value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise wrong()
        return build(tp, value, path)
    if origin in (list, tuple):
        item = _item(tp)
        items = [value] if origin is list and _is_scalar(value, item) else value
        if not isinstance(items, (list, tuple)) or (origin is list and not items):
            raise wrong()
        checked = [_check(v, item, f"{path}[{i}]") for i, v in enumerate(items)]
        return checked if origin is list else tuple(checked)
    if tp is dict or origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise wrong()
        if not args:
            return dict(value)
        for key in value:
            _check(key, args[0], f"{path} key {key!r}")
        return {key: _check(v, args[1], f"{path}.{key}") for key, v in value.items()}
    if tp in _SCALARS:
        if not _is_scalar(value, tp):
            raise wrong()
        return float(value) if tp is float else value
    raise TypeError(f"unsupported option annotation {tp!r} at {path}")


def _is_scalar(value: Any, tp: type) -> bool:
    """``value`` is of scalar type ``tp``: an ``int`` is a ``float`` too, a ``bool`` is no number."""
    if isinstance(value, bool):
        return tp is bool
    return isinstance(value, (int, float) if tp is float else tp)


_COMPARISONS = {">": operator.gt, ">=": operator.ge}


def check_ranges(section: Any, bounds: Mapping[str, Sequence[str]], prefix: str = "") -> None:
    """Every named field of an option section within its bound, else a ``ValueError`` naming it.

    ``bounds`` maps a bound to field names: ``"> 0"``, ``">= 0"``, ``">= 1"`` (any number), or a closed
    interval ``"in [0, 1]"``. An unset optional field (``None``) passes. The message reads
    ``<prefix><name> must be <bound>, got <value>``; :func:`build` prefixes the section's path.
    """
    for bound, names in bounds.items():
        for name in names:
            value = getattr(section, name)
            if value is not None and not _within(value, bound):
                raise ValueError(f"{prefix}{name} must be {bound}, got {value}")


def _within(value: float, bound: str) -> bool:
    if bound.startswith("in ["):
        low, high = (float(x) for x in bound[4:-1].split(","))
        return low <= value <= high
    op, limit = bound.split()
    return _COMPARISONS[op](value, float(limit))
