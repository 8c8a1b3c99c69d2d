"""Preference pairs from a GRPO rollout batch (``online/pairs.py``): the best vs the worst response of each group,
by the first pair source on which they differ."""

from __future__ import annotations

import pytest

from verl_vllm_rm.online.pairs import best_vs_worst_pairs


def test_pairs_are_best_vs_worst_of_each_group(rollout):
    uids, sequences, rewards, expected = rollout
    assert sequences == expected
    chosen, rejected, sources = best_vs_worst_pairs(uids, sequences, rewards)
    assert chosen == [expected[4 * g + 1] for g in range(4)]  # first correct response of each group
    assert rejected == [expected[4 * g] for g in range(4)]  # first wrong one
    assert sources == [0] * 4
    assert best_vs_worst_pairs(uids, sequences, [1.0] * len(uids)) == ([], [], [])  # no gap, no signal


def test_a_group_that_ties_on_one_pair_source_takes_its_pair_from_the_next(rollout):
    """Sources in order of preference: group 0 ties on the first (all 1.0) and is decided by the second, where the
    longest response is best; the other groups by the first. A group that ties on every source has no pair."""
    uids, sequences, rewards, expected = rollout
    first = [1.0 if i < 4 else r for i, r in enumerate(rewards)]
    second = [float(len(s)) for s in sequences]
    chosen, rejected, sources = best_vs_worst_pairs(uids, sequences, [first, second])
    assert sources == [1, 0, 0, 0]
    longest, shortest = max(range(4), key=lambda i: (len(sequences[i]), -i)), min(range(4), key=lambda i: (len(
        sequences[i]), i))
    assert (chosen[0], rejected[0]) == (expected[longest], expected[shortest])
    assert chosen[1:] == [expected[4 * g + 1] for g in (1, 2, 3)]
    assert best_vs_worst_pairs(uids, sequences, [[1.0] * len(uids)] * 2) == ([], [], [])


def test_pairs_need_one_uid_sequence_and_reward_per_response(rollout):
    uids, sequences, rewards, _ = rollout
    with pytest.raises(ValueError, match=r"uids, sequences and rewards differ in length: 16, 15, 16; give one uid, "
                                         r"sequence and reward \(in each row of rewards\) per response"):
        best_vs_worst_pairs(uids, sequences[:-1], rewards)
