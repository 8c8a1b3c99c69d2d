"""Option sections read from their dataclasses (``dev/reference_docs/sections.py``): each key's type as the
reference prints it, its default as Hydra writes it, its allowed values and its meaning, nested and inline
sections included. (The reference pages built from the package's own sections: tests/unit/docs/.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional

from verl_vllm_rm.dev.reference_docs.sections import (REQUIRED, SECTION_DEFAULTS, nested_section, options, type_name,
                                                      value_text)
from verl_vllm_rm.options import check_ranges, inline


@dataclass
class _Client:
    timeout_s: float = 30.0
    """Seconds per request."""

    def __post_init__(self) -> None:
        check_ranges(self, {"> 0": ["timeout_s"]})


@dataclass
class _Route:
    name: str
    """The route's name."""
    weight: float = 1.0


@dataclass
class _Manager:
    url: str
    """Where the server listens."""
    mode: Literal["pairwise", "pointwise"] = "pointwise"
    """How responses are compared."""
    alpha: Optional[float] = 0.5
    """The mix."""
    tags: list[str] = field(default_factory=lambda: ["a", "b"])
    client: _Client = inline(_Client)
    judge: Optional[_Client] = None
    """A judge's client."""
    routes: tuple[_Route, ...] = ()
    """The routes."""
    weights: dict[str, float] = field(default_factory=dict)
    """Weights by name."""

    def __post_init__(self) -> None:
        check_ranges(self, {"in [0, 1]": ["alpha"]})


def test_types_print_as_a_user_writes_them():
    assert [type_name(t) for t in (str, int, float, bool, Any)] == ["str", "int", "float", "bool", "any"]
    assert type_name(Optional[int]) == "int or null" and type_name(int | str | None) == "int or str or null"
    assert type_name(Literal["a", "b"]) == "str" and type_name(list[str]) == "str or list[str]"
    assert type_name(tuple[_Route, ...]) == "list[section]" and type_name(_Client) == "section"
    assert type_name(dict[str, float]) == "mapping str -> float"
    assert type_name(Mapping[str, int]) == "mapping str -> int"
    assert type_name(dict) == "mapping"


def test_values_print_as_a_hydra_override_writes_them():
    assert [value_text(v) for v in (None, True, False, 3, 0.5, 1e-06, 2.0, "x")] == [
        "null", "true", "false", "3", "0.5", "1e-06", "2", "x"]
    assert value_text([1, None, (True, "a")]) == "[1, null, [true, a]]"
    assert value_text({"rm": 1.0, "rule": {"n": 2}}) == "{rm: 1, rule: {n: 2}}"


def test_a_nested_section_is_found_through_optional_and_in_a_tuple_of_them():
    assert nested_section(_Client) == (_Client, False)
    assert nested_section(Optional[_Client]) == (_Client, False)
    assert nested_section(tuple[_Route, ...]) == (_Route, True)
    assert nested_section(tuple[int, ...]) == (None, False) and nested_section(Optional[int]) == (None, False)


def test_every_key_of_a_section_with_its_type_default_allowed_values_and_meaning():
    by_path = {o.path: o for o in options(_Manager, "reward_kwargs.")}
    assert list(by_path) == ["reward_kwargs." + k for k in ("url", "mode", "alpha", "tags", "timeout_s", "judge",
                                                             "routes", "weights")]  # the inline section in place
    url, mode, alpha = by_path["reward_kwargs.url"], by_path["reward_kwargs.mode"], by_path["reward_kwargs.alpha"]
    assert (url.type, url.default, url.allowed, url.meaning) == ("str", REQUIRED, (), "Where the server listens.")
    assert (mode.type, mode.default, mode.allowed) == ("str", "pointwise", ("pairwise", "pointwise"))
    assert (alpha.type, alpha.default, alpha.allowed) == ("float or null", "0.5", ("in [0, 1]",))
    tags = by_path["reward_kwargs.tags"]
    assert (tags.type, tags.default, tags.meaning) == ("str or list[str]", "[a, b]", "")  # no docstring: no meaning
    timeout = by_path["reward_kwargs.timeout_s"]  # from the inline section: its own bound and meaning
    assert (timeout.default, timeout.allowed, timeout.meaning) == ("30", ("> 0",), "Seconds per request.")
    assert by_path["reward_kwargs.weights"].type == "mapping str -> float"
    assert by_path["reward_kwargs.weights"].default == "{}"


def test_nested_sections_are_named_for_their_own_keys():
    by_path = {o.path: o for o in options(_Manager)}
    judge, routes = by_path["judge"], by_path["routes"]
    assert (judge.type, judge.default, judge.section, judge.many, judge.section_path) == (
        "section or null", "null", _Client, False, "judge")
    assert (routes.type, routes.default, routes.section, routes.many, routes.section_path) == (
        "list[section]", "[]", _Route, True, "routes[]")
    assert [(o.path, o.default) for o in options(_Route, "routes[].")] == [("routes[].name", REQUIRED),
                                                                          ("routes[].weight", "1")]


@dataclass
class _WithSection:
    client: _Client = field(default_factory=_Client)


def test_a_section_defaulting_to_its_own_dataclass_shows_its_options_defaults():
    (client,) = options(_WithSection)
    assert (client.default, client.section) == (SECTION_DEFAULTS, _Client)
