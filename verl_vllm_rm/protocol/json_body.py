"""Request bodies read strictly, for every route: RFC 8259 JSON as written, and short echoes of it.

Python's ``json`` alone would accept ``NaN``/``Infinity``, read ``1e999`` as
infinity and keep the last of two equal keys; it raises ``RecursionError`` on
deep nesting and ``ValueError`` on integers past ``sys.get_int_max_str_digits()``.
Here each of those is a :class:`RequestError` (a 400 naming the problem).
"""

from __future__ import annotations

import json
import math
import reprlib
import sys
from typing import Any

from verl_vllm_rm.protocol.errors import RequestError


def _short_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxlong, r.maxother = 2, 6, 4, 60, 40, 60
    return r


_SHORT = _short_repr()


def preview(value: Any) -> str:
    """``repr`` cut short: an error message echoes what was sent, never megabytes or 1000 levels of it."""
    return _SHORT.repr(value)


def is_int(x: Any) -> bool:
    """A JSON integer (``true`` is a bool in JSON, an int in Python)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RequestError(f"key {preview(key)} appears twice in one JSON object; send each key once")
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise RequestError(f"{name} is not a JSON value (JSON numbers are finite); send a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RequestError(f"number {preview(text)} is too large for a 64-bit float; send a finite number")
    return value


def parse_json(body: bytes) -> Any:
    """Decode a request body; anything that is not plain, unambiguous JSON is a :class:`RequestError`.

    Python's ``json`` alone would accept ``NaN``/``Infinity``, read ``1e999`` as
    infinity and keep the last of two equal keys, and it raises ``RecursionError``
    on deep nesting and ``ValueError`` on integers past ``sys.get_int_max_str_digits()``.
    """
    try:
        return json.loads(body, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite_float)
    except UnicodeDecodeError as e:
        raise RequestError(f"request body is not UTF-8 ({e}); send UTF-8 encoded JSON") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"request body is not valid JSON ({e}); send a JSON object") from None
    except RecursionError:
        raise RequestError(
            "request body nests JSON arrays/objects too deeply to parse; send a flat JSON object"
        ) from None
    except ValueError:  # only int() raises a plain ValueError inside json.loads
        raise RequestError(
            f"request body has an integer of more than {sys.get_int_max_str_digits()} digits; "
            "no field of this API takes one"
        ) from None
