"""The option sections a run is configured with, read from their dataclasses: each field's type, default, allowed
values and meaning.

A field's meaning is its attribute docstring, the string statement right after it in the class body (as Sphinx
reads them); its allowed values are its ``Literal[...]`` and the bound its section's ``__post_init__`` gives it
in a :func:`~verl_vllm_rm.options.check_ranges` call (read from the source: the bounds are a literal there).
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, Union

from verl_vllm_rm.options import option_fields


REQUIRED = "required"  # the default shown for a field that has none
SECTION_DEFAULTS = "its options' defaults"  # ... for a section whose default is its own dataclass


@dataclass(frozen=True)
class Option:
    """One field of an option section, ready to print."""

    path: str  # the dotted key under the root (``judge.mode``; ``routes[].ensemble`` for list entries)
    type: str
    default: str  # a value as Hydra writes it, or REQUIRED, or SECTION_DEFAULTS
    allowed: tuple[str, ...]  # empty when any value of the type is allowed
    meaning: str
    section: type | None  # the dataclass of a nested section
    many: bool  # the field is a list of such sections

    @property
    def section_path(self) -> str:
        """The key of the nested section's options: ``routes[]`` for a list of them."""
        return f"{self.path}[]" if self.many else self.path


@cache
def _class_body(cls: type) -> ast.ClassDef:
    return ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]


def _own_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of the fields ``cls`` itself declares, each on one line."""
    body, docs = _class_body(cls).body, {}
    for stmt, after in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[stmt.target.id] = re.sub(r"\s+", " ", after.value.value).strip()
    return docs


def _own_bounds(cls: type) -> dict[str, str]:
    """``field -> bound`` from the ``check_ranges(self, {...})`` calls of ``cls``'s own ``__post_init__``."""
    bounds = {}
    for node in ast.walk(_class_body(cls)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check_ranges"
                and len(node.args) > 1):
            for bound, names in ast.literal_eval(node.args[1]).items():
                bounds.update(dict.fromkeys(names, bound))
    return bounds


def _inherited(cls: type, own: typing.Callable[[type], dict[str, str]]) -> dict[str, str]:
    """``own`` over ``cls`` and its dataclass bases, a subclass's entry winning."""
    merged: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            merged.update(own(klass))
    return merged


def field_meanings(cls: type) -> dict[str, str]:
    """Field name -> meaning (attribute docstring), for every field of ``cls`` that has one."""
    return _inherited(cls, _own_docs)


def _optional_inner(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def nested_section(tp: Any) -> tuple[type | None, bool]:
    """(the dataclass a field's values are sections of, whether the field is a list of them)."""
    tp = _optional_inner(tp)
    if dataclasses.is_dataclass(tp):
        return tp, False
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and args and dataclasses.is_dataclass(args[0]):
        return args[0], True
    return None, False


def type_name(tp: Any) -> str:
    """A field's annotation as the reference prints it (``str or list[str]``, ``mapping str -> float``)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "any"
    if origin in (Union, types.UnionType):
        return " or ".join([type_name(a) for a in args if a is not type(None)] + ["null"] * (type(None) in args))
    if origin is Literal:
        return type_name(type(args[0]))
    if origin is list:
        return f"{type_name(args[0])} or list[{type_name(args[0])}]"
    if origin is tuple:
        return f"list[{type_name(args[0])}]"
    if tp is dict or origin in (dict, collections.abc.Mapping):
        return f"mapping {type_name(args[0])} -> {type_name(args[1])}" if args else "mapping"
    if dataclasses.is_dataclass(tp):
        return "section"
    return tp.__name__


def value_text(value: Any) -> str:
    """A value as a Hydra override would write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(value_text(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return REQUIRED
    return SECTION_DEFAULTS if dataclasses.is_dataclass(value) else value_text(value)


def _allowed(tp: Any, bound: str | None) -> tuple[str, ...]:
    inner = _optional_inner(tp)
    if typing.get_origin(inner) is Literal:
        return tuple(value_text(a) for a in typing.get_args(inner))
    return (bound,) if bound else ()


def options(cls: type, prefix: str = "") -> list[Option]:
    """Every option key of the option dataclass ``cls`` (:func:`~verl_vllm_rm.options.option_fields`: an inline
    section's keys in its place), its key prefixed with ``prefix``."""
    out = []
    for f, owner in option_fields(cls):
        hint = typing.get_type_hints(owner)[f.name]
        out.append(Option(f"{prefix}{f.name}", type_name(hint), _default(f), _allowed(hint, _inherited(
            owner, _own_bounds).get(f.name)), field_meanings(owner).get(f.name, ""), *nested_section(hint)))
    return out
