"""The GRPO-shaped batch builder of the dev tools (``dev/grpo_batch.py``)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.dev.grpo_batch import Group, build_batch


def test_rows_longer_than_the_given_widths_are_refused_naming_the_row():
    groups = [Group([1, 2], [[3]]), Group([4, 5, 6], [[7, 8], [9]])]
    assert build_batch(groups, pad_id=0).batch["prompts"].shape == (3, 3)  # None: the longest prompt
    with pytest.raises(ValueError, match=r"row 1: prompt/response of 3/2 tokens is longer than prompt_len=2/"
                                         r"response_len=4: raise them, or leave them None"):
        build_batch(groups, pad_id=0, prompt_len=2, response_len=4)
