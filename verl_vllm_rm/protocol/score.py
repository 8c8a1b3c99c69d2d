"""The ``POST /score`` schema, both ways: the server parses requests and builds answers
with it, the client checks answers with it.

Pure Python (no vllm import) so the rules are easy to read and to test. Every
rejection names the problem and how to fix it; nothing here touches the engine.
A request the server refuses raises :class:`RequestError` (a 4xx); an answer the
client refuses raises :class:`ScoreResponseError` (retried like a 5xx).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from verl_vllm_rm.protocol.errors import RequestError
from verl_vllm_rm.protocol.json_body import is_int, parse_json, preview

SCORE_FIELDS = ("model", "input", "normalize")
INPUT_SHAPE = "a non-empty list of strings or of token-id lists"


class ScoreResponseError(ValueError):
    """A ``/score`` answer that breaks the schema: an error, never a number."""


@dataclass(frozen=True)
class ScoreRequest:
    """A validated ``POST /score`` body. ``texts`` xor ``token_ids`` is set."""

    model: str | None
    texts: list[str] | None
    token_ids: list[list[int]] | None
    normalize: bool

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# -- request ----------------------------------------------------------------------------
def _json_type(x: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if x is None else names[type(x)]


def _texts(inputs: list[str]) -> list[str]:
    for i, text in enumerate(inputs):
        try:
            text.encode()
        except UnicodeEncodeError as e:
            raise RequestError(
                f"input[{i}] has a lone UTF-16 surrogate {preview(e.object[e.start:e.end])} at character {e.start}, "
                "which is not text; send valid Unicode (pair each \\ud800-\\udbff escape with a \\udc00-\\udfff)"
            ) from None
    return list(inputs)


def _token_ids(inputs: list[list[Any]]) -> list[list[int]]:
    for i, ids in enumerate(inputs):
        if not ids:
            raise RequestError(f"input[{i}] is an empty token-id list")
        bad = next((j for j, t in enumerate(ids) if not is_int(t)), None)
        if bad is not None:
            raise RequestError(
                f"input[{i}] must contain only integer token ids; input[{i}][{bad}] is {preview(ids[bad])}"
            )
    return [list(x) for x in inputs]


def parse_score_request(body: bytes, served_models: list[str], max_batch_size: int) -> ScoreRequest:
    """Validate a ``/score`` body: shapes and types only (lengths need the tokenizer)."""
    payload = parse_json(body)
    if not isinstance(payload, dict):
        raise RequestError(
            f"request body must be a JSON object with fields {list(SCORE_FIELDS)}, got a JSON {_json_type(payload)}"
        )
    unknown = sorted(set(payload) - set(SCORE_FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {preview(unknown)}; valid fields are {list(SCORE_FIELDS)}")
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(f"'model' must be a string, one of {served_models}; got {preview(model)}")
    if model is not None and model not in served_models:
        raise RequestError(f"model {preview(model)} is not served here; served models: {served_models}", 404)
    normalize = payload.get("normalize", False)
    if not isinstance(normalize, bool):
        raise RequestError(f"'normalize' must be true or false, got {preview(normalize)}")
    if "input" not in payload:
        raise RequestError(f"missing field 'input': {INPUT_SHAPE}")
    inputs = payload["input"]
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(f"'input' must be {INPUT_SHAPE}, got {preview(inputs)}")
    if len(inputs) > max_batch_size:
        raise RequestError(
            f"'input' has {len(inputs)} items, more than this server's --max-score-batch {max_batch_size}; "
            "split the request",
            413,
        )
    if all(isinstance(x, str) for x in inputs):
        return ScoreRequest(model, _texts(inputs), None, normalize)
    if all(isinstance(x, list) for x in inputs):
        return ScoreRequest(model, None, _token_ids(inputs), normalize)
    kinds = sorted({_json_type(x) for x in inputs})
    raise RequestError(
        f"'input' mixes or uses unsupported item types {kinds}; send all strings or all token-id lists"
    )


def longest_input(health: dict[str, Any]) -> int:
    """The most tokens a client may send to a server whose ``/health`` is ``health``: its ``max_model_len``, less
    the reward token it appends to every input (``reward_token``, a model whose card reads the score there)."""
    return int(health["max_model_len"]) - (1 if health.get("reward_token") else 0)


def check_token_ids(token_ids: list[list[int]], vocab_size: int, max_model_len: int,
                    reward_token: tuple[int, str] | None = None) -> None:
    """Reject ids outside the vocabulary and inputs the engine cannot hold (``reward_token``: the token the server
    appended, which the input's length counts)."""
    appended = "" if reward_token is None else f" with the reward token {reward_token[1]} ({reward_token[0]}) appended"
    for i, ids in enumerate(token_ids):
        if not ids:
            raise RequestError(f"input[{i}] tokenizes to no tokens; send non-empty text")
        if len(ids) > max_model_len:
            raise RequestError(
                f"input[{i}] has {len(ids)} tokens{appended}, longer than max_model_len={max_model_len}; "
                "truncate it (the client's overlong policy does this) or restart the server "
                "with a larger --max-model-len"
            )
        bad = next((t for t in ids if t < 0 or t >= vocab_size), None)
        if bad is not None:
            raise RequestError(f"input[{i}] has token id {preview(bad)} outside the vocabulary [0, {vocab_size})")


# -- response ---------------------------------------------------------------------------
def finite_or_raise(values: list[float], index: int) -> list[float]:
    if not all(math.isfinite(v) for v in values):
        raise RuntimeError(f"the model produced a non-finite score for input[{index}]: {values}")
    return values


def score_response(
    model: str, scores: Sequence[float | None], prompt_tokens: int, step_scores: Sequence[list[float]] | None = None,
    version: int | None = None, attributes: Sequence[list[float]] | None = None,
) -> dict[str, Any]:
    """``{"model", "data": [{"index"[, "score"][, "step_scores"][, "attributes"]}], "usage": {"prompt_tokens"}
    [, "version"]}``, in input order; ``version``: the weight version (``/runtime_version``) that computed every
    score. A head without one outcome score (attributes, a process reward model) leaves ``score`` out."""
    data: list[dict[str, Any]] = [{"index": i} if s is None else {"index": i, "score": s} for i, s in enumerate(scores)]
    for item, steps in zip(data, step_scores or ()):
        item["step_scores"] = steps
    for item, values in zip(data, attributes or ()):
        item["attributes"] = values
    body = {"model": model, "data": data, "usage": {"prompt_tokens": prompt_tokens}}
    if version is not None:
        body["version"] = version
    return body


class Scores(list):
    """The scores of one ``/score`` answer in input order (None where the head gives no outcome score: an
    attribute head, a process reward model), ``version``: the weight version that computed them (None when the
    server does not say), ``steps``: each input's step scores (None when the server reads no steps) and
    ``attributes``: each input's attribute values (None unless the head has attributes). A client sets
    ``failovers``: how often the request moved to another server after a failure."""

    version: int | None = None
    steps: list[list[float]] | None = None
    attributes: list[list[float]] | None = None
    failovers: int = 0


def _numbers(item: dict, field: str, idx: int) -> list[float] | None:
    """``item[field]``, a list of finite numbers, or None when absent."""
    if field not in item:
        return None
    values = item[field]
    if not isinstance(values, list) or not all(_is_number(v) for v in values):
        raise ScoreResponseError(f"/score returned bad {field} {preview(values)} for input {idx}")
    return [float(v) for v in values]


def parse_score_response(body: Any, n: int) -> Scores:
    """The ``n`` scores of a ``/score`` answer in input order (and its weight version), or
    :class:`ScoreResponseError`.

    Checks what a client reads: one object per input, each index once, finite numbers (``step_scores`` and
    ``attributes`` too, when present), a score unless the item has step scores or attributes instead, an integer
    ``version`` when present.
    """
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise ScoreResponseError(f"malformed /score response (no 'data' list): {preview(body)}")
    data = body["data"]
    if len(data) != n:
        raise ScoreResponseError(f"/score returned {len(data)} scores for {n} inputs")
    scores: list[float | None] = [None] * n
    step_scores: list[list[float] | None] = [None] * n
    attributes: list[list[float] | None] = [None] * n
    seen: set[int] = set()
    for item in data:
        if not isinstance(item, dict):
            raise ScoreResponseError(f"/score returned a non-object item {preview(item)}")
        idx = item.get("index")
        if not is_int(idx) or not 0 <= idx < n or idx in seen:
            raise ScoreResponseError(f"/score returned a bad or repeated index {preview(idx)}")
        seen.add(idx)
        step_scores[idx], attributes[idx] = _numbers(item, "step_scores", idx), _numbers(item, "attributes", idx)
        score = item.get("score")
        if "score" in item or (step_scores[idx] is None and attributes[idx] is None):
            if not _is_number(score):
                raise ScoreResponseError(
                    f"/score returned a non-finite or non-numeric score {preview(score)} for input {idx}"
                )
            scores[idx] = float(score)
    version = body.get("version")
    if version is not None and not is_int(version):
        raise ScoreResponseError(f"/score returned a non-integer weight version {preview(version)}")
    result = Scores(scores)
    result.version = version
    if any(s is not None for s in step_scores):
        result.steps = [s or [] for s in step_scores]
    if any(a is not None for a in attributes):
        result.attributes = [a or [] for a in attributes]
    return result
