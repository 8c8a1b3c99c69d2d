"""Length rewards counted in policy TOKENS: total length and thought length.

Two shapes, both <= 0 (penalties), both vectorised over the batch:

* band: 0 inside ``[min_tokens, max_tokens]``, ``-penalty_per_token`` per token
  outside it. This is rm-gallery's ``length_penalty`` formula, except that
  rm-gallery counts characters of the decoded text and we count tokens: the
  policy is charged for what it generates, and tokens need no decoding.
* overlong (total length only): DAPO's soft overlong punishment, as in verl's
  ``reward_loop/reward_manager/dapo.py``: 0 up to ``max_response_tokens -
  overlong_buffer``, then linear down to ``-overlong_penalty_factor``
  at ``max_response_tokens``. It discourages hitting the generation limit, where a
  truncated answer would otherwise be scored as if complete.

Each reward returns its values and the raw lengths, for ``reward_extra_info``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from verl_vllm_rm.rewards.spans import ThinkTagIds, thought_token_counts
from verl_vllm_rm.rewards.token_batch import as_token_batch


class LengthReward(NamedTuple):
    """Reward values and the token counts they were computed from."""

    values: np.ndarray
    lengths: np.ndarray


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_rate(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def check_band(min_tokens: int, max_tokens: int | None, penalty_per_token: float) -> None:
    """Raise ValueError if the band parameters are inconsistent."""
    if not _is_int(min_tokens) or min_tokens < 0:
        raise ValueError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < min_tokens):
        raise ValueError(f"max_tokens must be null (no upper bound) or an integer >= min_tokens ({min_tokens}), "
                         f"got {max_tokens!r}")
    _check_rate("penalty_per_token", penalty_per_token)


def check_overlong(max_response_tokens: int | None, overlong_buffer: int, overlong_penalty_factor: float) -> None:
    """Raise ValueError unless the overlong settings are off (buffer 0) or consistent."""
    if not _is_int(overlong_buffer) or overlong_buffer < 0:
        raise ValueError(f"overlong_buffer must be an integer >= 0 (0 turns the overlong penalty off), "
                         f"got {overlong_buffer!r}")
    _check_rate("overlong_penalty_factor", overlong_penalty_factor)
    if overlong_buffer and (not _is_int(max_response_tokens) or max_response_tokens < overlong_buffer):
        raise ValueError(f"overlong_buffer={overlong_buffer} needs max_response_tokens (the rollout's max response "
                         f"length, e.g. data.max_response_length) >= overlong_buffer, got {max_response_tokens!r}")


def band_penalty(lengths: Any, min_tokens: int = 0, max_tokens: int | None = None,
                 penalty_per_token: float = 0.01) -> np.ndarray:
    """``-penalty_per_token * (tokens below min_tokens + tokens above max_tokens)``."""
    check_band(min_tokens, max_tokens, penalty_per_token)
    n = np.asarray(lengths, dtype=np.float64)
    outside = np.maximum(min_tokens - n, 0.0)
    if max_tokens is not None:
        outside += np.maximum(n - max_tokens, 0.0)
    return -penalty_per_token * outside + 0.0  # + 0.0 turns -0.0 into 0.0 in logs


def overlong_penalty(lengths: Any, max_response_tokens: int, overlong_buffer: int,
                     overlong_penalty_factor: float = 1.0) -> np.ndarray:
    """DAPO: ``min(-(n - (max - buffer)) / buffer * factor, 0)``; ``-factor`` at exactly max tokens."""
    check_overlong(max_response_tokens, overlong_buffer, overlong_penalty_factor)
    if overlong_buffer == 0:
        raise ValueError("overlong_penalty needs overlong_buffer > 0 (the number of tokens over which it ramps)")
    exceed = np.asarray(lengths, dtype=np.float64) - (max_response_tokens - overlong_buffer)
    return np.minimum(-exceed / overlong_buffer * overlong_penalty_factor, 0.0) + 0.0


def length_reward(lengths: Any, *, min_tokens: int = 0, max_tokens: int | None = None,
                  penalty_per_token: float = 0.01, max_response_tokens: int | None = None,
                  overlong_buffer: int = 0, overlong_penalty_factor: float = 1.0) -> LengthReward:
    """Total-length reward: band penalty plus, when ``overlong_buffer > 0``, DAPO's overlong penalty."""
    n = np.asarray(lengths)
    values = band_penalty(n, min_tokens, max_tokens, penalty_per_token)
    check_overlong(max_response_tokens, overlong_buffer, overlong_penalty_factor)
    if overlong_buffer:
        values = values + overlong_penalty(n, max_response_tokens, overlong_buffer, overlong_penalty_factor)
    return LengthReward(values, n.astype(np.float64))


def thought_length_reward(token_ids: Any, lengths: Any, tags: ThinkTagIds, *, min_tokens: int = 0,
                          max_tokens: int | None = None, penalty_per_token: float = 0.01) -> LengthReward:
    """Band penalty on the number of tokens inside the think block (see ``spans`` for how it is found)."""
    ids, lens = as_token_batch(token_ids, lengths)
    thought = thought_token_counts(ids, lens, tags)
    return LengthReward(band_penalty(thought, min_tokens, max_tokens, penalty_per_token), thought.astype(np.float64))
