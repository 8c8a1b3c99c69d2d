"""Fitting a prompt + response into a reward model's context (``client/length.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from verl_vllm_rm.client.length import OverlongInputError, fit_to_length


def test_fit_to_length_joins_lists_and_arrays_as_int64_and_drops_prompt_from_the_left():
    ids, dropped = fit_to_length(np.array([1, 2, 3]), [4, 5], max_length=4, policy="truncate_prompt_left")
    assert ids.tolist() == [2, 3, 4, 5] and dropped == 1 and ids.dtype == np.int64
    ids, dropped = fit_to_length([], [], max_length=4, policy="error")  # empty lists stay integer, not float
    assert ids.tolist() == [] and dropped == 0 and ids.dtype == np.int64
    with pytest.raises(OverlongInputError, match="overlong_policy=truncate_prompt_left"):
        fit_to_length([1, 2, 3], np.array([4, 5]), max_length=4, policy="error")
    with pytest.raises(OverlongInputError, match="the response alone has 4 tokens"):
        fit_to_length([1], np.array([2, 3, 4, 5]), max_length=4, policy="truncate_prompt_left")
