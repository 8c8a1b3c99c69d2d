"""Request bodies read strictly (``protocol.json_body``): RFC 8259 JSON as written, each other body a 400 naming
the problem, and the short echoes an error message makes of what was sent."""

from __future__ import annotations

import re
import sys

import pytest

from verl_vllm_rm.protocol.errors import RequestError
from verl_vllm_rm.protocol.json_body import is_int, parse_json, preview


def test_parse_json_is_shared_strictness():
    """The weight routes read their bodies with the same parser."""
    assert parse_json(b'{"a": [1, 2.5, "x", null, true], "b": {"c": -0}}') == {
        "a": [1, 2.5, "x", None, True], "b": {"c": 0}
    }
    with pytest.raises(RequestError, match="key 'c' appears twice"):
        parse_json(b'{"b": {"c": 1, "c": 2}}')


def test_plain_json_reads_as_python_values_and_a_key_may_repeat_in_separate_objects():
    assert parse_json(b'[{"k": 1}, {"k": -2.5e3}, "\\u00e9", 12345678901234567890]') == [
        {"k": 1}, {"k": -2500.0}, "\u00e9", 12345678901234567890]
    assert parse_json(b"  7 ") == 7


@pytest.mark.parametrize("body, message", [
    (b'{"a": "\xff"}', "request body is not UTF-8 ("),
    (b"{'a': 1}", "request body is not valid JSON (Expecting property name enclosed in double quotes"),
    (b"[" * 100_000 + b"]" * 100_000, "request body nests JSON arrays/objects too deeply to parse; send a flat JSON "
                                      "object"),
    (b"9" * 5000, f"request body has an integer of more than {sys.get_int_max_str_digits()} digits; no field of this "
                  "API takes one"),
    (b"[NaN]", "NaN is not a JSON value (JSON numbers are finite); send a finite number"),
    (b'{"x": -Infinity}', "-Infinity is not a JSON value (JSON numbers are finite); send a finite number"),
    (b"[-1e400]", "number '-1e400' is too large for a 64-bit float; send a finite number"),
    (b'{"k": 1, "j": 2, "k": 3}', "key 'k' appears twice in one JSON object; send each key once"),
], ids=["not utf-8", "not json", "deep", "long int", "NaN", "-Infinity", "float overflow", "duplicate key"])
def test_each_body_that_is_not_plain_json_is_a_400_naming_the_problem(body, message):
    with pytest.raises(RequestError, match=f"^{re.escape(message)}") as err:
        parse_json(body)
    assert err.value.status == 400


def test_an_echo_of_what_was_sent_is_cut_short():
    assert preview("m" * 10_000) == "'" + "m" * 27 + "..." + "m" * 28 + "'"
    assert preview(list(range(10))) == "[0, 1, 2, 3, 4, 5, ...]"
    assert preview({i: i for i in range(6)}) == "{0: 0, 1: 1, 2: 2, 3: 3, ...}"
    assert preview([[[[1]]]]) == "[[[...]]]"
    assert preview("short") == "'short'"


def test_a_json_integer_is_an_int_that_is_not_a_bool():
    assert is_int(0) and is_int(-3) and is_int(10**30)
    assert not is_int(True) and not is_int(False) and not is_int(1.0) and not is_int("1")
