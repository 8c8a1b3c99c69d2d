"""Format reward: does the decoded response have the expected structure? 1.0 or 0.0.

Why on text: tags such as ``<answer>`` are usually not single tokens, and BPE
splits them differently depending on their neighbours, so a structure check on
token ids would be fragile. The loop over responses is the one loop here; each
check is a C-level substring or regex search.

Two ways to state the structure:

* ``blocks`` (default ``("think", "answer")``): each ``<tag>...</tag>`` block
  must appear, in this order, each one after the end of the previous one. So
  the default asks for a think block followed by an answer block, anything
  around them allowed. Checked with ``str.find``, which is ~20x faster than the
  equivalent lazy regex ``<think>.*?</think>.*?<answer>.*?</answer>``.
* ``pattern``: any regular expression (``re.DOTALL``, searched anywhere);
  replaces ``blocks``. E.g. ``r"</think>\\s*\\S"`` for templates that open the
  think block in the prompt and answer in free text after it, or
  ``r"^<think>.*?</think>\\s*<answer>.*?</answer>\\s*$"`` for nothing outside
  the blocks.

rm-gallery's ``reasoning_format`` gives 1.0 when both blocks are present in ANY
order (even nested); with the default ``blocks`` we also require the answer to
come after the think block. On responses where the answer does not precede the
think block the two agree.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Callable, Sequence

import numpy as np


def _markers_in_order(text: str, markers: tuple[str, ...]) -> bool:
    pos = 0
    for marker in markers:
        at = text.find(marker, pos)
        if at < 0:
            return False
        pos = at + len(marker)
    return True


def format_checker(blocks: Sequence[str] = ("think", "answer"), pattern: str | None = None) -> Callable[[str], bool]:
    """Build the structure check; raises ValueError for a bad regex or empty/odd tag names."""
    if pattern is not None:
        try:
            regex = re.compile(pattern, re.DOTALL)
        except (re.error, TypeError) as exc:
            raise ValueError(f"format pattern {pattern!r} is not a valid regular expression ({exc}); "
                             "fix it, or drop it to check `blocks` instead") from exc
        return lambda text: regex.search(text) is not None
    if (isinstance(blocks, str) or not isinstance(blocks, Sequence) or not blocks
            or not all(isinstance(b, str) and b and b.strip("<>/ ") == b for b in blocks)):
        raise ValueError(f"format blocks must be a non-empty list of tag names without brackets, "
                         f"e.g. ['think', 'answer'], got {blocks!r}")
    markers = tuple(marker for tag in blocks for marker in (f"<{tag}>", f"</{tag}>"))
    return partial(_markers_in_order, markers=markers)


def format_reward(texts: Sequence[str], *, blocks: Sequence[str] = ("think", "answer"),
                  pattern: str | None = None) -> np.ndarray:
    """1.0 for each response with the required structure, else 0.0 (float64 array)."""
    check = format_checker(blocks, pattern)
    return np.fromiter((check(text) for text in texts), dtype=np.float64, count=len(texts))
