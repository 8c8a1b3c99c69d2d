"""Preference pairs from a GRPO rollout batch: the best vs the worst response of each group.

A group is the responses sampled for one prompt (same ``uid``). Ranking them by
the verifiable (rule) reward gives free preference labels for the reward model:
the best response is "chosen", the worst "rejected". Groups whose best and worst
rewards differ by no more than ``min_gap`` (e.g. all correct) carry no signal
and are skipped. Plain lists; the verl wrapper lives in ``online/driver.py``.
"""

from __future__ import annotations

from typing import Hashable, Sequence


def best_vs_worst_pairs(
    uids: Sequence[Hashable],
    sequences: Sequence[list[int]],
    rewards: Sequence[float],
    min_gap: float = 0.0,
) -> tuple[list[list[int]], list[list[int]]]:
    """``(chosen, rejected)`` sequences, one pair per group with a reward gap above ``min_gap``.

    Ties resolve to the earliest response, so the result is deterministic.
    """
    if not len(uids) == len(sequences) == len(rewards):
        raise ValueError(f"uids, sequences and rewards differ in length: {len(uids)}, {len(sequences)}, {len(rewards)}")
    groups: dict[Hashable, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    chosen, rejected = [], []
    for members in groups.values():
        best = max(members, key=lambda i: (rewards[i], -i))
        worst = min(members, key=lambda i: (rewards[i], i))
        if rewards[best] - rewards[worst] > min_gap:
            chosen.append(list(sequences[best]))
            rejected.append(list(sequences[worst]))
    return chosen, rejected
