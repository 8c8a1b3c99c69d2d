"""Find the think block in padded token-id batches, without decoding.

How the thought is located (on token ids, not text offsets):

* a tag is the token-id sequence the tokenizer gives the tag string on its own
  (``think_tag_ids``). Reasoning chat models (Qwen3, DeepSeek-R1, ...) register
  ``<think>`` and ``</think>`` as single added tokens, so the match is exact. If a
  tag is NOT an added token, BPE may merge its characters with neighbours in
  context (``"\\n<think>"``) and that occurrence is then not found: use tags that
  are added tokens, or check ``think_tag_ids`` returns one id per tag;
* the thought starts after the first open tag; when the response has no open tag
  but does have a close tag it starts at token 0 (chat templates such as
  DeepSeek-R1's open the think block in the prompt);
* it ends at the first close tag after its start; when there is none but the
  open tag was found, it runs to the end of the response (a thought cut off by
  the length limit is a long thought, not an absent one);
* a response with neither tag has a thought of 0 tokens.

The search is vectorised over the whole batch: one comparison pass per token of
the tag (a tag has one to a few tokens), never a loop over response tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from verl_vllm_rm.rewards.token_batch import as_token_batch


class ThinkTagIds(NamedTuple):
    """Token-id sequences of the open and close think tags."""

    open: tuple[int, ...]
    close: tuple[int, ...]


def think_tag_ids(tokenizer: Any, open_tag: str = "<think>", close_tag: str = "</think>") -> ThinkTagIds:
    """Encode the tags with a Hugging Face tokenizer (no special tokens added).

    Call once when the manager starts; the result is plain ints, cheap to ship to
    workers.
    """
    tags = []
    for tag in (open_tag, close_tag):
        ids = tuple(int(i) for i in tokenizer.encode(tag, add_special_tokens=False))
        if not ids:
            raise ValueError(f"the tokenizer encodes the think tag {tag!r} to no tokens; set another tag")
        tags.append(ids)
    return ThinkTagIds(*tags)


def find_first(ids: np.ndarray, lengths: np.ndarray, seq: Sequence[int], start: np.ndarray | None = None) -> np.ndarray:
    """Per row, where the first occurrence of ``seq`` begins; -1 where there is none.

    Only occurrences that begin at or after ``start`` (per row, default 0) and end
    within the row's length count. ``ids``/``lengths`` as from ``as_token_batch``.
    """
    k = len(seq)
    width = ids.shape[1] - k + 1
    if k == 0 or width <= 0:
        return np.full(ids.shape[0], -1, dtype=np.int64)
    hit = np.ones((ids.shape[0], width), dtype=bool)
    for j, token in enumerate(seq):
        hit &= ids[:, j:j + width] == token
    pos = np.arange(width)
    hit &= pos <= (lengths - k)[:, None]
    if start is not None:
        hit &= pos >= start[:, None]
    return np.where(hit.any(axis=1), hit.argmax(axis=1), -1)


def thought_token_counts(token_ids: Any, lengths: Any, tags: ThinkTagIds) -> np.ndarray:
    """Number of tokens inside the think block of each response (tags excluded)."""
    ids, lens = as_token_batch(token_ids, lengths)
    open_at = find_first(ids, lens, tags.open)
    has_open = open_at >= 0
    start = np.where(has_open, open_at + len(tags.open), 0)
    close_at = find_first(ids, lens, tags.close, start=start)
    end = np.where(close_at >= 0, close_at, np.where(has_open, lens, start))
    return end - start
