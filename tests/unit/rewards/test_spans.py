"""Finding the think block on token ids (``rewards/spans.py``): single- and multi-token tags, a block opened in the
prompt, a truncated thought, padding never read, tags encoded by a real tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from verl_vllm_rm.rewards import ThinkTagIds, think_tag_ids, thought_token_counts

TAGS = ThinkTagIds(open=(1,), close=(2,))



@pytest.mark.parametrize(
    "row, length, expected",
    [
        ([1, 5, 6, 7, 2, 9], 6, 3),  # open, body, close, answer
        ([1, 2, 9], 3, 0),  # empty think block
        ([5, 6, 2, 9], 4, 2),  # template opened the block in the prompt
        ([1, 5, 6, 7], 4, 3),  # truncated inside the thought: runs to the end
        ([5, 6, 7], 3, 0),  # no think block
        ([], 0, 0),  # empty response
        ([2, 5, 1, 6, 7], 5, 2),  # a stray close before the open tag is ignored
        ([1, 5, 2, 1, 6, 6, 2], 7, 1),  # only the first block counts
        ([1, 5, 6, 2], 3, 2),  # the close tag lies in the padding: not seen
    ],
)
def test_thought_tokens_single_token_tags(row, length, expected, padded):
    ids, _ = padded([row], pad=2, width=8)  # pad with the close-tag id on purpose
    assert thought_token_counts(ids, [length], TAGS)[0] == expected


def test_thought_tokens_multi_token_tags(padded):
    tags = ThinkTagIds(open=(10, 11), close=(12, 13))
    rows = [[10, 11, 5, 6, 12, 13, 7], [10, 5, 6, 12, 13], [10, 11, 12, 5, 13], [5, 10, 11]]
    ids, lengths = padded(rows)
    np.testing.assert_array_equal(thought_token_counts(ids, lengths, tags), [2, 3, 3, 0])


def test_think_tag_ids_with_a_real_tokenizer(word_tokenizer, padded):
    tags = think_tag_ids(word_tokenizer)
    assert len(tags.open) == len(tags.close) == 1
    texts = ["<think>a b c</think> answer", "a b</think>the answer", "<think>a a a a", "answer"]
    ids, lengths = padded([word_tokenizer.encode(t, add_special_tokens=False) for t in texts])
    np.testing.assert_array_equal(thought_token_counts(ids, lengths, tags), [3, 2, 4, 0])


def test_think_tag_that_encodes_to_nothing_is_an_error(word_tokenizer):
    with pytest.raises(ValueError, match="encodes the think tag ' ' to no tokens"):
        think_tag_ids(word_tokenizer, open_tag=" ")
