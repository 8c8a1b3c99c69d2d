"""The padded token batch every token-level reward takes (``rewards/token_batch.py``): int64 ids and lengths out of
numpy, torch or lists, and each malformed batch refused naming what is wrong (the same refusals through a reward:
``test_ngram.py``'s ``test_bad_batches_are_named``)."""

from __future__ import annotations

import numpy as np
import pytest

from verl_vllm_rm.rewards.token_batch import as_token_batch


def test_ids_and_lengths_come_back_as_int64_whatever_integer_type_they_came_in():
    import torch  # the manager passes verl's tensors

    for ids, lengths in (([[1, 2, 0], [3, 0, 0]], [2, 1]),
                         (np.array([[1, 2, 0], [3, 0, 0]], dtype=np.int32), np.array([2, 1], dtype=np.uint8)),
                         (torch.tensor([[1, 2, 0], [3, 0, 0]]), torch.tensor([2, 1]))):
        got_ids, got_lengths = as_token_batch(ids, lengths)
        assert got_ids.dtype == np.int64 and got_lengths.dtype == np.int64
        assert got_ids.tolist() == [[1, 2, 0], [3, 0, 0]] and got_lengths.tolist() == [2, 1]


def test_an_int64_batch_is_not_copied_and_its_padding_is_left_as_it_is():
    ids = np.array([[7, -1, -1], [8, 9, 10]], dtype=np.int64)
    lengths = np.array([1, 3], dtype=np.int64)
    got_ids, got_lengths = as_token_batch(ids, lengths)
    assert got_ids is ids and got_lengths is lengths


def test_lengths_may_be_zero_or_the_whole_width_and_a_batch_may_be_empty():
    ids, lengths = as_token_batch(np.zeros((2, 4), dtype=np.int64), [0, 4])
    assert lengths.tolist() == [0, 4]
    ids, lengths = as_token_batch(np.zeros((0, 4), dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert ids.shape == (0, 4) and lengths.shape == (0,)


@pytest.mark.parametrize(
    "ids, lengths, message",
    [
        (np.arange(6), [6], r"token_ids must be a padded \[batch, max_len\] array, got shape \(6,\); stack the "
                            r"responses and pad them on the right"),
        (np.zeros((1, 2, 3), dtype=np.int64), [2], r"got shape \(1, 2, 3\)"),
        (np.zeros((2, 4)), [4, 4], "token_ids must hold integer token ids, got dtype float64"),
        (np.zeros((2, 4), dtype=np.int64), [4], r"lengths must be one integer per row \(2 rows\), got shape \(1,\) "
                                                r"dtype int64"),
        (np.zeros((2, 4), dtype=np.int64), [4.0, 4.0], r"lengths must be one integer per row \(2 rows\), got shape "
                                                       r"\(2,\) dtype float64"),
        (np.zeros((2, 4), dtype=np.int64), [4, 5], r"lengths must lie in \[0, 4\] \(the padded width\), got min 4 "
                                                   r"max 5"),
        (np.zeros((2, 4), dtype=np.int64), [-1, 2], r"lengths must lie in \[0, 4\] \(the padded width\), got min -1 "
                                                    r"max 2"),
    ],
)
def test_a_malformed_batch_is_refused_naming_the_problem(ids, lengths, message):
    with pytest.raises(ValueError, match=message):
        as_token_batch(ids, np.asarray(lengths))
