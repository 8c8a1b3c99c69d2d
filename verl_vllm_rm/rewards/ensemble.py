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
samples. A whitening can start from a ``prior`` (the merged statistics saved with a
checkpoint); it then reports separately what it has ``seen`` since, so the workers' shares
merge (Chan et al.'s parallel update, :meth:`Moments.merged`) without counting the prior twice.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal, Mapping

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


@dataclass
class Moments:
    """Count, mean and sum of squared deviations (``m2``) of a stream of scores."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def std(self) -> float:
        """Population std; 1.0 until two scores (with some spread) have been seen."""
        return math.sqrt(self.m2 / self.count) if self.count >= 2 and self.m2 > 0 else 1.0

    def add(self, x: float) -> None:
        """Welford's update."""
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (x - self.mean)

    def merged(self, other: "Moments") -> "Moments":
        """The moments of both streams together (Chan, Golub and LeVeque's pairwise update)."""
        count = self.count + other.count
        if count == 0:
            return Moments()
        delta = other.mean - self.mean
        return Moments(count, self.mean + delta * other.count / count,
                       self.m2 + other.m2 + delta * delta * self.count * other.count / count)

    def to_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any], where: str) -> "Moments":
        """Moments saved by :meth:`to_dict`; anything else is an error naming ``where`` it came from."""
        try:
            count, mean, m2 = int(state["count"]), float(state["mean"]), float(state["m2"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: whitening statistics need count, mean and m2 numbers, got {state!r}") from e
        if count < 0 or m2 < 0 or not (math.isfinite(mean) and math.isfinite(m2)) or count != state["count"]:
            raise ValueError(f"{where}: whitening statistics need an integer count >= 0 and a finite mean and "
                             f"m2 >= 0, got {state!r}")
        return cls(count, mean, m2)


class RunningWhitening:
    """Running mean/std of one RM's raw scores (Welford) over a ``prior`` and what it has ``seen`` since;
    ``update_and_whiten`` adds a score and whitens it."""

    def __init__(self, prior: Moments | None = None) -> None:
        self.prior = prior or Moments()
        self.seen = Moments()
        self.total = Moments(self.prior.count, self.prior.mean, self.prior.m2)

    def start_from(self, prior: Moments) -> None:
        """Take ``prior`` as the statistics before this worker's first score (only before it has any)."""
        if self.seen.count:
            raise RuntimeError(f"whitening has already seen {self.seen.count} scores: a prior must come first")
        self.__init__(prior)

    @property
    def count(self) -> int:
        return self.total.count

    @property
    def mean(self) -> float:
        return self.total.mean

    @property
    def std(self) -> float:
        """Population std of the scores seen (prior included); 1.0 until two have been seen."""
        return self.total.std

    def update(self, x: float) -> None:
        self.seen.add(x)
        self.total.add(x)

    def whiten(self, x: float) -> float:
        """``x`` on the current scale, without adding it (a reference answer is not a sample)."""
        return (x - self.mean) / self.std

    def update_and_whiten(self, x: float) -> float:
        self.update(x)
        return self.whiten(x)

    def state(self) -> dict[str, float]:
        return {"count": float(self.count), "mean": self.mean, "std": self.std}
