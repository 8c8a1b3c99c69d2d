"""N-gram repetition penalty over response token ids, vectorised over the batch.

Degenerate loops ("the the the ...", a paragraph pasted again and again) are a
common failure of RL-trained policies; a reward model rarely punishes them
reliably, a repetition count does.

Definition, for one response of ``L`` tokens and ``n = ngram_size``:

* ``T = max(L - n + 1, 0)`` n-gram windows, ``U`` distinct n-grams among them;
* repetition rate ``r = (T - U) / (T - 1)`` for ``T >= 2``, else ``0``: the share
  of windows that repeat an earlier one, out of the most that could (all but the
  first). ``r = 0`` when no n-gram repeats; ``r = 1`` when every window is the
  same n-gram (e.g. one token repeated);
* ``scaling = clip((r - min_scaling) / (1 - min_scaling), 0, 1)``: rates up to
  ``min_scaling`` are tolerated (natural text repeats a little), above it the
  penalty ramps linearly;
* ``penalty = max_penalty * scaling``, in ``[max_penalty, 0]``.

Alignment with rm-gallery's ``ngram_repetition_penalty`` (soft mode): same ``T``
and ``U`` (given the same tokens), same ``min_scaling`` ramp, but rm-gallery (like
open-r1's repetition penalty, after Yeo et al. 2025, "Demystifying Long
Chain-of-Thought Reasoning", App. C.2) uses ``r_g = (T - U) / T``, which never
reaches 1: a fully repetitive response would get only ``(T - 1) / T`` of
``max_penalty``. ``r = r_g * T / (T - 1)``: the two differ by the factor ``T / (T
- 1)`` (0.1 % at 1,000 tokens, more for short responses). rm-gallery also maps
``r_g == min_scaling`` exactly to ``r_g`` instead of 0, a discontinuity we do not
copy. And rm-gallery tokenizes text (tiktoken if installed, else lower-cased
whitespace words); we use the policy's token ids.

Implementation: each window is hashed to 64 bits (tokens multiplied by an odd
constant, then folded with multiply/xor), windows are sorted per row and distinct
values counted from the sorted order. Two different n-grams are counted as one
only if their hashes collide, with probability about ``2**-64`` per pair of
windows (about ``3e-14`` for a 1,000-token response). Rows are processed in
chunks so that a chunk's hash array stays in the CPU cache.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from verl_vllm_rm.rewards.token_batch import as_token_batch

_ROWS_PER_CHUNK = 128  # ~1 MB of hashes per chunk at 1,000 tokens: cache-resident, ~2x faster than one pass
_TOKEN_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constants (golden ratio, FNV-1 64 prime)
_FOLD = np.uint64(0x100000001B3)


def _check_ngram_size(ngram_size: int) -> None:
    if isinstance(ngram_size, bool) or not isinstance(ngram_size, (int, np.integer)) or ngram_size < 1:
        raise ValueError(f"ngram_size must be a positive integer (tokens per n-gram, default 5), got {ngram_size!r}")


def check_ngram_params(ngram_size: int, max_penalty: float, min_scaling: float) -> None:
    """Raise ValueError naming the bad parameter and the accepted range."""
    _check_ngram_size(ngram_size)
    if isinstance(max_penalty, bool) or not isinstance(max_penalty, (int, float)) or not -math.inf < max_penalty <= 0:
        raise ValueError(f"max_penalty must be a finite number <= 0 (the penalty of a fully repetitive response, "
                         f"default -1.0), got {max_penalty!r}")
    if isinstance(min_scaling, bool) or not isinstance(min_scaling, (int, float)) or not 0 <= min_scaling < 1:
        raise ValueError(f"min_scaling must be in [0, 1) (the tolerated repetition rate, default 0.1), "
                         f"got {min_scaling!r}")


def _distinct_windows(ids: np.ndarray, totals: np.ndarray, n: int) -> np.ndarray:
    """Distinct n-gram count per row of one chunk; ``totals`` = valid windows per row (> 0 for some row)."""
    width = int(totals.max())
    mixed = ids[:, :width + n - 1].view(np.uint64) * _TOKEN_MIX
    hashes = mixed[:, :width].copy()
    for j in range(1, n):  # one pass per n-gram position, each over the whole chunk
        hashes *= _FOLD
        hashes ^= mixed[:, j:j + width]
    # Windows past a row's end repeat its first window, so they add no distinct value.
    np.copyto(hashes, hashes[:, :1], where=np.arange(width) >= totals[:, None])
    hashes.sort(axis=1)
    distinct = 1 + np.count_nonzero(hashes[:, 1:] != hashes[:, :-1], axis=1)
    return np.where(totals > 0, distinct, 0)


def ngram_counts(token_ids: Any, lengths: Any, ngram_size: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Per response: ``(U, T)`` = (distinct n-grams, n-gram windows), as int64 arrays."""
    _check_ngram_size(ngram_size)
    ids, lens = as_token_batch(token_ids, lengths)
    totals = np.maximum(lens - ngram_size + 1, 0)
    distinct = np.zeros_like(totals)
    for lo in range(0, ids.shape[0], _ROWS_PER_CHUNK):
        chunk = slice(lo, lo + _ROWS_PER_CHUNK)
        if totals[chunk].max(initial=0) > 0:
            distinct[chunk] = _distinct_windows(ids[chunk], totals[chunk], ngram_size)
    return distinct, totals


def ngram_repetition_penalty(token_ids: Any, lengths: Any, ngram_size: int = 5, max_penalty: float = -1.0,
                             min_scaling: float = 0.1) -> np.ndarray:
    """Repetition penalty per response in ``[max_penalty, 0]``; the formula is in the module docstring."""
    check_ngram_params(ngram_size, max_penalty, min_scaling)
    distinct, totals = ngram_counts(token_ids, lengths, ngram_size)
    rate = np.divide(totals - distinct, totals - 1, out=np.zeros(totals.shape), where=totals > 1)
    scaling = np.clip((rate - min_scaling) / (1.0 - min_scaling), 0.0, 1.0)
    return max_penalty * scaling + 0.0  # + 0.0 turns -0.0 into 0.0 in logs
