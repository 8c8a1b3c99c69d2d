"""Several reward models' scores of one sample as one number, and each RM's scale made comparable.

``ensemble`` combines K member scores (NaN: a member masked after a failed score) with
``mean``, ``min``, ``median`` or ``mean_minus_std`` (``mean - lambda * std``: the
uncertainty-penalised ensemble of Coste et al., 2023, "Reward Model Ensembles Help Mitigate
Overoptimization"). The std is the population std (ddof 0) over the members present.

``RunningWhitening`` puts one RM's raw scores on a common scale:
``whitened = (x - mean) / std`` with the running mean and std of every valid raw score of
that RM seen so far by this manager, ``x`` included (Welford's update, applied as each
score arrives, before it is whitened). Until two scores have been seen the std is taken
as 1 (the first score whitens to 0). Each reward-loop worker keeps its own statistics: the
workers see random shares of the same stream, so their estimates agree after a few dozen
samples.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import numpy as np

EnsembleMethod = Literal["mean", "min", "median", "mean_minus_std"]
ENSEMBLE_METHODS: tuple[str, ...] = ("mean", "min", "median", "mean_minus_std")


def ensemble(scores: np.ndarray, method: EnsembleMethod, uncertainty_penalty: float = 1.0
             ) -> tuple[np.ndarray, np.ndarray]:
    """``(value, std)`` per row of ``scores`` (shape ``[n, K]``, NaN for an absent member).

    A row with no member present gets NaN for both: the caller decides what that sample is
    (its failure policy), never this function.
    """
    scores = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    if method not in ENSEMBLE_METHODS:
        raise ValueError(f"ensemble={method!r} is not one of {list(ENSEMBLE_METHODS)}")
    with warnings.catch_warnings():  # all-NaN rows are NaN on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        std = np.nanstd(scores, axis=1)
        if method == "mean":
            value = np.nanmean(scores, axis=1)
        elif method == "min":
            value = np.nanmin(scores, axis=1)
        elif method == "median":
            value = np.nanmedian(scores, axis=1)
        else:
            value = np.nanmean(scores, axis=1) - uncertainty_penalty * std
    return value, std


class RunningWhitening:
    """Running mean/std of one RM's raw scores (Welford); ``update_and_whiten`` adds a score and whitens it."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0

    @property
    def std(self) -> float:
        """Population std of the scores seen; 1.0 until two have been seen."""
        return math.sqrt(self._m2 / self.count) if self.count >= 2 and self._m2 > 0 else 1.0

    def update(self, x: float) -> None:
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (x - self.mean)

    def whiten(self, x: float) -> float:
        """``x`` on the current scale, without adding it (a reference answer is not a sample)."""
        return (x - self.mean) / self.std

    def update_and_whiten(self, x: float) -> float:
        self.update(x)
        return self.whiten(x)

    def state(self) -> dict[str, float]:
        return {"count": float(self.count), "mean": self.mean, "std": self.std}
