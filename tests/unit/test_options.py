"""The one config validator (``verl_vllm_rm.options.build``): every error path, on small dataclasses and on one of
the package's real option sections (the reward manager's own: tests/unit/scoring/test_options.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Literal, Mapping

import pytest
from omegaconf import OmegaConf

from verl_vllm_rm.options import ConfigError, build


@dataclass(frozen=True)
class Band:
    low: int = 0
    high: int = 10

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(f"high must be >= low, got {self.high} < {self.low}")


@dataclass(frozen=True)
class Opts:
    name: str = "x"
    flag: bool = False
    count: int = 1
    rate: float = 0.5
    limit: int | None = None
    mode: Literal["a", "b"] = "a"
    urls: list[str] = field(default_factory=lambda: ["u"])
    tags: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)
    weights: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    band: Band = field(default_factory=Band)
    anything: Any = None

    def __post_init__(self) -> None:
        if self.count > 100:
            raise ValueError(f"count must be <= 100, got {self.count}")


@dataclass
class Required:
    path: str
    size: int = 1


@dataclass
class Outer:
    inner: Opts = field(default_factory=Opts)
    maybe: Band | None = None


def test_defaults_and_no_options():
    assert build(Opts, None, "opts") == build(Opts, {}, "opts") == Opts()


def test_valid_values_are_stored_normalised():
    opts = build(Opts, {"name": "n", "flag": True, "count": 3, "rate": 2, "limit": None, "mode": "b",
                        "urls": "http://one", "tags": ["p", "q"], "extra": {"k": [1]}, "weights": {"w": 1},
                        "params": {"p": {"k": 1}}, "band": {"high": 4}, "anything": [object]}, "opts")
    assert opts.rate == 2.0 and isinstance(opts.rate, float)  # an integer is a number
    assert isinstance(opts.weights["w"], float)
    assert opts.urls == ["http://one"]  # one string stands for a list of one
    assert opts.tags == ("p", "q")  # a list given for a tuple field is stored as a tuple
    assert opts.band == Band(low=0, high=4)
    assert (opts.limit, opts.mode, opts.extra, opts.params) == (None, "b", {"k": [1]}, {"p": {"k": 1}})


def test_unknown_keys_list_the_valid_options_and_suggest_a_close_one():
    with pytest.raises(ConfigError) as err:
        build(Opts, {"nmae": "n", "zzz": 1}, "opts")
    message = str(err.value)
    assert message.startswith("unknown opts option(s) ['nmae', 'zzz']; valid options are: name, flag, count, rate")
    assert message.endswith("band, anything; did you mean 'name' for 'nmae'?")


def test_no_suggestion_when_nothing_is_close():
    with pytest.raises(ConfigError, match=r"\['qqq'\]; valid options are: name, .*, anything$"):
        build(Opts, {"qqq": 1}, "opts")


def test_missing_required_options_are_named():
    with pytest.raises(ConfigError,
                       match=r"missing required req option\(s\) \['path'\]; valid options are: path, size"):
        build(Required, {"size": 2}, "req")
    assert build(Required, {"path": "p"}, "req") == Required(path="p")


def test_a_section_that_is_not_a_mapping():
    with pytest.raises(ConfigError, match=r"opts must be a mapping of options \(name, flag, .*\), got \[1\]"):
        build(Opts, [1], "opts")


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"flag": "yes"}, "opts.flag must be true or false, got 'yes'"),
        ({"flag": 1}, "opts.flag must be true or false, got 1"),
        ({"count": "3"}, "opts.count must be an integer, got '3'"),
        ({"count": 2.0}, "opts.count must be an integer, got 2.0"),
        ({"count": True}, "opts.count must be an integer, got True"),
        ({"rate": False}, "opts.rate must be a number, got False"),
        ({"rate": "0.5"}, "opts.rate must be a number, got '0.5'"),
        ({"name": 3}, "opts.name must be a string, got 3"),
        ({"name": None}, "opts.name must be a string, got None"),
        ({"limit": "many"}, "opts.limit must be an integer or null, got 'many'"),
        ({"mode": "c"}, "opts.mode='c' is not one of ['a', 'b']"),
        ({"urls": []}, "opts.urls must be a string or a non-empty list of strings, got []"),
        ({"urls": {"a": 1}}, "opts.urls must be a string or a non-empty list of strings, got {'a': 1}"),
        ({"urls": ["ok", 5]}, "opts.urls[1] must be a string, got 5"),
        ({"tags": "p"}, "opts.tags must be a list of strings, got 'p'"),
        ({"tags": ["p", None]}, "opts.tags[1] must be a string, got None"),
        ({"extra": [1]}, "opts.extra must be a mapping, got [1]"),
        ({"weights": [1.0]}, "opts.weights must be a mapping of strings to numbers, got [1.0]"),
        ({"weights": {"w": "1"}}, "opts.weights.w must be a number, got '1'"),
        ({"weights": {1: 1.0}}, "opts.weights key 1 must be a string, got 1"),
        ({"params": {"p": 3}}, "opts.params.p must be a mapping of strings to values, got 3"),
        ({"band": 5}, "opts.band must be a mapping of options (low, high), got 5"),
        ({"band": {"top": 5}}, "unknown opts.band option(s) ['top']; valid options are: low, high"),
        ({"band": {"high": "5"}}, "opts.band.high must be an integer, got '5'"),
        ({"band": {"low": 5, "high": 1}}, "opts.band: high must be >= low, got 1 < 5"),
        ({"count": 101}, "opts: count must be <= 100, got 101"),
    ],
)
def test_bad_values_name_the_path_and_what_is_expected(raw, message):
    with pytest.raises(ConfigError) as err:
        build(Opts, raw, "opts")
    assert str(err.value) == message


def test_nested_sections_carry_dotted_paths():
    with pytest.raises(ConfigError, match=r"^outer\.inner\.band\.low must be an integer, got 'x'$"):
        build(Outer, {"inner": {"band": {"low": "x"}}}, "outer")
    with pytest.raises(ConfigError, match=r"^outer\.inner\.band: high must be >= low, got 1 < 5$"):
        build(Outer, {"inner": {"band": {"low": 5, "high": 1}}}, "outer")
    with pytest.raises(ConfigError, match=r"^outer\.maybe must be a mapping of options \(low, high\) or null, got 3$"):
        build(Outer, {"maybe": 3}, "outer")
    assert build(Outer, {"maybe": None}, "outer").maybe is None
    assert build(Outer, {"maybe": {"low": 2}}, "outer").maybe == Band(low=2)


def test_dictconfig_input_is_resolved_and_checked_like_a_dict():
    raw = OmegaConf.create({"base": 7, "opts": {"count": "${base}", "urls": ["a", "b"], "band": {"high": 3},
                                                "weights": {"w": 0.5}}})
    opts = build(Opts, raw.opts, "opts")
    assert opts == Opts(count=7, urls=["a", "b"], band=Band(high=3), weights={"w": 0.5})
    assert type(opts.urls) is list and type(opts.weights) is dict  # no OmegaConf containers are kept
    with pytest.raises(ConfigError, match=r"^opts\.band\.high must be an integer, got 'high'$"):
        build(Opts, OmegaConf.create({"band": {"high": "high"}}), "opts")
    with pytest.raises(ConfigError, match=r"^unknown opts option\(s\) \['cnt'\]"):
        build(Opts, OmegaConf.create({"cnt": 1}), "opts")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@dataclass(frozen=True)
class Lists:
    bands: tuple[Band, ...] = ()
    raw: tuple[dict, ...] = ()


def test_a_list_of_sections_checks_each_with_its_index_in_the_path():
    got = build(Lists, {"bands": [{"low": 1}, {}], "raw": [{"a": 1}]}, "lists")
    assert got.bands == (Band(low=1), Band()) and got.raw == ({"a": 1},)
    with pytest.raises(ConfigError, match=r"^unknown lists\.bands\[1\] option\(s\) \['lo'\]; .*did you mean 'low'"):
        build(Lists, {"bands": [{}, {"lo": 1}]}, "lists")
    with pytest.raises(ConfigError, match=r"^lists\.bands\[0\]: high must be >= low"):
        build(Lists, {"bands": [{"low": 5, "high": 1}]}, "lists")
    with pytest.raises(ConfigError, match=r"^lists\.bands must be a list of mappings of options \(low, high\)"):
        build(Lists, {"bands": {"low": 1}}, "lists")
    with pytest.raises(ConfigError, match=r"^lists\.raw\[0\] must be a mapping, got 3$"):
        build(Lists, {"raw": [3]}, "lists")


SCALAR_NAMES = r"\['bool', 'int', 'float', 'str'\]"


@pytest.mark.parametrize("annotation, value, message", [
    (tuple[str, int], ["b", 2], r"^unsupported option annotation tuple\[str, int\]: use list\[S\] or tuple\[S, \.\.\.\] "
                                rf"with S in {SCALAR_NAMES}, or tuple\[X, \.\.\.\] with X a dataclass or dict$"),
    (list[dict], [{}], r"^unsupported option annotation list\[dict\]: use list\[S\]"),
    (int | str | None, 1, r"^unsupported option annotation int \| str \| None: only X \| None unions are supported$"),
    (set[int], [1], r"^unsupported option annotation set\[int\] at odd\.field$"),
    # a wrong value's message describes the annotation, and cannot describe a set
    (dict[str, set[int]], 5, r"^unsupported option annotation set\[int\]$"),
])
def test_an_unsupported_annotation_is_a_programming_error_that_names_it(annotation, value, message):
    Odd = make_dataclass("Odd", [("field", annotation, field(default=None))])

    with pytest.raises(TypeError, match=message):
        build(Odd, {"field": value}, "odd")
