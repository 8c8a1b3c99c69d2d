"""The RM step's engine input (``online/bt.py``): pairs that cannot be one are refused, naming why."""

from __future__ import annotations

import pytest

from verl_vllm_rm.online.bt import pair_batch


def test_pairs_become_one_interleaved_batch_with_one_loss_token_per_sequence():
    data = pair_batch([[1, 2, 3]], [[4, 5]])
    assert [row.tolist() for row in data["input_ids"].unbind()] == [[1, 2, 3], [4, 5]]
    assert [row.tolist() for row in data["loss_mask"].unbind()] == [[0, 0, 1], [0, 1]]


@pytest.mark.parametrize("chosen, rejected, got", [([[1, 2]], [], "1 and 0"), ([], [], "0 and 0")])
def test_unmatched_or_no_pairs_are_refused(chosen, rejected, got):
    with pytest.raises(ValueError, match=rf"need as many chosen as rejected sequences \(>0\), got {got}"):
        pair_batch(chosen, rejected)


def test_a_pair_with_an_empty_sequence_is_refused_naming_it():
    """The loss reads each sequence's value at its last token: an empty one has none."""
    with pytest.raises(ValueError, match=r"preference pair\(s\) \[1\] hold an empty sequence: every chosen and "
                                         r"rejected sequence needs at least one token"):
        pair_batch([[1, 2], [3]], [[4], []])
