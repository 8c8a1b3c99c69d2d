"""Request parsing and validation for the reward routes.

Pure Python (no vllm import) so the rules are easy to read and to test. Every
rejection names the problem and how to fix it; nothing here touches the engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from verl_vllm_rm.protocol.errors import RequestError

SCORE_FIELDS = ("model", "input", "normalize")


@dataclass(frozen=True)
class ScoreRequest:
    """A validated ``POST /score`` body. ``texts`` xor ``token_ids`` is set."""

    model: str | None
    texts: list[str] | None
    token_ids: list[list[int]] | None
    normalize: bool

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.token_ids)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"request body is not valid JSON ({e}); send a JSON object") from None


def parse_score_request(body: bytes, served_models: list[str], max_batch_size: int) -> ScoreRequest:
    """Validate a ``/score`` body: shapes and types only (lengths need the tokenizer)."""
    payload = parse_json(body)
    if not isinstance(payload, dict):
        raise RequestError(f"request body must be a JSON object with fields {list(SCORE_FIELDS)}")
    unknown = sorted(set(payload) - set(SCORE_FIELDS))
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}; valid fields are {list(SCORE_FIELDS)}")
    model = payload.get("model")
    if model is not None and model not in served_models:
        raise RequestError(f"model {model!r} is not served here; served models: {served_models}", 404)
    normalize = payload.get("normalize", False)
    if not isinstance(normalize, bool):
        raise RequestError(f"'normalize' must be true or false, got {normalize!r}")
    if "input" not in payload:
        raise RequestError("missing field 'input': a non-empty list of strings or of token-id lists")
    inputs = payload["input"]
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("'input' must be a non-empty list of strings or of token-id lists")
    if len(inputs) > max_batch_size:
        raise RequestError(
            f"'input' has {len(inputs)} items, more than this server's --max-score-batch {max_batch_size}; "
            "split the request",
            413,
        )
    if all(isinstance(x, str) for x in inputs):
        return ScoreRequest(model, list(inputs), None, normalize)
    if all(isinstance(x, list) for x in inputs):
        for i, ids in enumerate(inputs):
            if not ids:
                raise RequestError(f"input[{i}] is an empty token-id list")
            if not all(_is_int(t) for t in ids):
                raise RequestError(f"input[{i}] must contain only integer token ids")
        return ScoreRequest(model, None, [list(x) for x in inputs], normalize)
    kinds = sorted({type(x).__name__ for x in inputs})
    raise RequestError(
        f"'input' mixes or uses unsupported item types {kinds}; send all strings or all token-id lists"
    )


def check_token_ids(token_ids: list[list[int]], vocab_size: int, max_model_len: int) -> None:
    """Reject ids outside the vocabulary and inputs the engine cannot hold."""
    for i, ids in enumerate(token_ids):
        if not ids:
            raise RequestError(f"input[{i}] tokenizes to no tokens; send non-empty text")
        if len(ids) > max_model_len:
            raise RequestError(
                f"input[{i}] has {len(ids)} tokens, longer than max_model_len={max_model_len}; "
                "truncate it (the client's overlong policy does this) or restart the server "
                "with a larger --max-model-len"
            )
        bad = next((t for t in ids if t < 0 or t >= vocab_size), None)
        if bad is not None:
            raise RequestError(f"input[{i}] has token id {bad} outside the vocabulary [0, {vocab_size})")


def finite_or_raise(values: list[float], index: int) -> list[float]:
    if not all(math.isfinite(v) for v in values):
        raise RuntimeError(f"the model produced a non-finite score for input[{index}]: {values}")
    return values
