"""Validation of the padded token batch that the token-level rewards share.

Every token-level reward takes the same input: ``token_ids``, a right-padded
``[batch, max_len]`` integer array (verl's ``responses`` tensor works as is), and
``lengths``, the number of valid tokens in each row. Values past a row's length
are padding and never read, whatever they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def as_token_batch(token_ids: Any, lengths: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(ids, lengths)`` as int64 arrays after checking shapes and bounds.

    Raises ValueError naming the problem (wrong rank, non-integer dtype, a length
    outside ``[0, max_len]``), because a silent broadcast here would score the
    wrong tokens.
    """
    ids = np.asarray(token_ids)
    lens = np.asarray(lengths)
    if ids.ndim != 2:
        raise ValueError(
            f"token_ids must be a padded [batch, max_len] array, got shape {ids.shape}; "
            "stack the responses and pad them on the right"
        )
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token_ids must hold integer token ids, got dtype {ids.dtype}")
    if lens.shape != (ids.shape[0],) or not np.issubdtype(lens.dtype, np.integer):
        raise ValueError(
            f"lengths must be one integer per row ({ids.shape[0]} rows), got shape {lens.shape} dtype {lens.dtype}"
        )
    if lens.size and (lens.min() < 0 or lens.max() > ids.shape[1]):
        raise ValueError(
            f"lengths must lie in [0, {ids.shape[1]}] (the padded width), got min {lens.min()} max {lens.max()}"
        )
    return ids.astype(np.int64, copy=False), lens.astype(np.int64, copy=False)
