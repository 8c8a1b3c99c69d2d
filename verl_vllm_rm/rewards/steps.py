"""Process rewards: one response's step scores (the RM's head at each step tag) as a reward.

A server started with ``--step-tag-id`` returns, per input, the score at every position
holding that token. ``aggregate_steps`` turns a response's steps into one scalar;
``token_rewards`` spreads a composed reward over the response so that each step's score
lands on the token that ends the step (token-level rewards, summing to the composed total).
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np

StepReward = Literal["none", "min", "last", "mean", "prod", "token"]
#: The scalar aggregations (``prod`` multiplies the steps' sigmoids: the chance that every step is right).
SCALAR_STEP_REWARDS = ("min", "last", "mean", "prod")


def aggregate_steps(steps: Sequence[float], method: str, normalized: bool) -> float:
    """One scalar from a response's step scores; NaN when it has no step (the caller's failure policy decides).

    ``normalized``: the steps are already sigmoid probabilities (``normalize: true``), so ``prod`` multiplies
    them as they are; otherwise it multiplies their sigmoids.
    """
    if method not in SCALAR_STEP_REWARDS:
        raise ValueError(f"step reward {method!r} is not one of {list(SCALAR_STEP_REWARDS)}")
    if not steps:
        return math.nan
    s = np.asarray(steps, dtype=np.float64)
    if method == "min":
        return float(s.min())
    if method == "last":
        return float(s[-1])
    if method == "mean":
        return float(s.mean())
    probs = s if normalized else 1.0 / (1.0 + np.exp(-s))
    return float(np.prod(probs))


def response_steps(steps: Sequence[float], rm_ids: Sequence[int], prompt_len: int, step_tag_id: int) -> list[float]:
    """The step scores of the response: those after the step tags that stand in the prompt part (the first
    ``prompt_len`` ids of the RM input), which the server scores too."""
    in_prompt = int(np.count_nonzero(np.asarray(rm_ids[:prompt_len]) == step_tag_id))
    return list(steps[in_prompt:])


def token_rewards(length: int, positions: Sequence[int], steps: Sequence[float], coef: float,
                  rest: float) -> list[float]:
    """Per-token rewards of a response of ``length`` tokens: ``coef * step_i`` on the token that ends step ``i``
    (``positions[i]``; a token ending two steps holds both) and ``rest`` on the last token. With the composed
    reward linear in the RM component ``r`` (``total(r) = rest + coef * r``) they sum to ``total(sum(steps))``."""
    if len(positions) != len(steps):
        raise ValueError(f"{len(steps)} step scores for {len(positions)} step-ending tokens in the response")
    out = np.zeros(length)
    np.add.at(out, np.asarray(positions, dtype=np.int64), coef * np.asarray(steps, dtype=np.float64))
    out[-1] += rest
    return out.tolist()
