"""Fitting a prompt + response into a reward model's context: prompt tokens go first, from the left.

The whole response is always scored (its last token carries the score); an input that cannot
keep it, or any overlong input under ``overlong_policy=error``, is an error naming the fix.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class OverlongInputError(ValueError):
    pass


def fit_to_length(prompt: Sequence[int], response: Sequence[int], max_length: int,
                  policy: str) -> tuple[np.ndarray, int]:
    """Concatenate (as one int64 array), dropping prompt tokens from the left when the total exceeds
    ``max_length``."""
    overflow = max(0, len(prompt) + len(response) - max_length)
    if overflow and policy == "error":
        raise OverlongInputError(
            f"prompt ({len(prompt)}) + response ({len(response)}) tokens exceed the reward model's max length "
            f"{max_length}; set reward_kwargs.overlong_policy=truncate_prompt_left or raise the server's --max-model-len"
        )
    if overflow and overflow >= len(prompt) and len(response):
        raise OverlongInputError(
            f"the response alone has {len(response)} tokens, more than the reward model's max length {max_length} "
            "minus one prompt token; raise the server's --max-model-len or lower data.max_response_length"
        )
    kept = np.asarray(prompt[overflow:], dtype=np.int64)
    return np.concatenate((kept, np.asarray(response, dtype=np.int64))), overflow
