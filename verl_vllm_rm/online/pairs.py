"""Preference pairs from a GRPO rollout batch: the best vs the worst response of each group.

A group is the responses sampled for one prompt (same ``uid``). Ranking them by
the verifiable (rule) reward gives free preference labels for the reward model:
the best response is "chosen", the worst "rejected". Groups whose best and worst
rewards differ by no more than ``min_gap`` (e.g. all correct) carry no signal
on that reward: the next pair source decides, and without one they are skipped. Plain lists; the verl wrapper lives in ``online/driver.py``.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np


def best_vs_worst_pairs(
    uids: Sequence[Hashable],
    sequences: Sequence[list[int]],
    rewards: Sequence[float] | Sequence[Sequence[float]],
    min_gap: float = 0.0,
) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """``(chosen, rejected, sources)``: one pair per group with a reward gap above ``min_gap``.

    ``rewards`` is one reward per response, or several rows of them (one per pair source, in
    order of preference): a group's pair comes from the first source on which its best and worst
    responses differ by more than ``min_gap``, and ``sources`` gives that row for each pair. Ties
    resolve to the earliest response, so the result is deterministic.
    """
    table = np.atleast_2d(np.asarray(rewards, dtype=np.float64))
    if not len(uids) == len(sequences) == table.shape[1]:
        raise ValueError(f"uids, sequences and rewards differ in length: {len(uids)}, {len(sequences)}, "
                         f"{table.shape[1]}; give one uid, sequence and reward (in each row of rewards) per response")
    groups: dict[Hashable, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid, []).append(i)
    chosen, rejected, sources = [], [], []
    for members in groups.values():
        for source, row in enumerate(table):
            best = max(members, key=lambda i: (row[i], -i))
            worst = min(members, key=lambda i: (row[i], i))
            if row[best] - row[worst] > min_gap:
                chosen.append(list(sequences[best]))
                rejected.append(list(sequences[worst]))
                sources.append(source)
                break
    return chosen, rejected, sources
