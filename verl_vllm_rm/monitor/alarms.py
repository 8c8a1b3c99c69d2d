"""Reward-hacking alarms: each is a number per step and a documented threshold.

Every function takes one step's per-sample arrays and returns ``None`` when the
step cannot say (too few samples, no spread, no groups); a ``None`` alarm is not
logged. ``warnings`` turns the values that cross their threshold into one line each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Fewer valid samples than this in a step and the correlations are noise: not reported.
MIN_SAMPLES = 8
#: Fewer verifier-ordered pairs than this in a step and the disagreement share is noise: not reported.
MIN_PAIRS = 4
#: A score is pinned at an end of the scale when its sigmoid is below this or above 1 - this.
PINNED = 0.01


@dataclass(frozen=True)
class Alarm:
    metric: str
    threshold: float
    above: bool  # True: the alarm fires when the value exceeds the threshold; False: when it falls below
    meaning: str
    advice: str

    def tripped(self, value: float) -> bool:
        return value > self.threshold if self.above else value < self.threshold


ALARMS = (
    Alarm("alarm/length_hacking", 0.5, True, "corr(RM score, response length) in the step",
          "the RM pays for length: read long samples; add a length reward or penalty (rewards.length)"),
    Alarm("alarm/verifiable_disagreement", 0.35, True,
          "share of same-prompt pairs where the RM ranks the verified-worse response above the verified-better",
          "the RM disagrees with the verifier: check the RM on this data or weight the verifiable reward up"),
    Alarm("alarm/dead_groups", 0.5, True, "share of GRPO groups whose rewards are all equal",
          "most groups carry no learning signal: raise rollout.n or temperature, or make the reward finer"),
    Alarm("alarm/saturation", 0.25, True, f"share of RM scores with sigmoid < {PINNED} or > {1 - PINNED}",
          "the RM is saturated: its scores no longer rank responses; lower the RM's scale or retrain it"),
    Alarm("alarm/drift_rank_corr", 0.5, False,
          "rank correlation between the current and the initial RM on a fixed probe set (online RM)",
          "the online RM has moved far from where it started: lower online_rm.lr or check its pairs"),
)


#: ``alarm/attribute_rise/<rm>/<watched>_over_<other>`` (``reward_kwargs.attribute_alarms``)
ATTRIBUTE_RISE = "alarm/attribute_rise/"


def attribute_rise_alarm(metric: str) -> Alarm:
    """The alarm of one watched attribute pair (its metric names the pair)."""
    return Alarm(metric, 1.0, True, "how far the watched attribute's step mean rose since the run's first step "
                 "beyond the other's, each in its first-step standard deviations",
                 "the policy gains the watched attribute without the other: weight it down (or the other up) in the "
                 "RM's attributes, and read the samples")


def run_alarms(metric_names) -> list[Alarm]:
    """The fixed alarms and the attribute-rise alarms among ``metric_names``."""
    rises = sorted({name for name in metric_names if name.startswith(ATTRIBUTE_RISE)})
    return [*ALARMS, *map(attribute_rise_alarm, rises)]


class AttributeRise:
    """One watched pair of an attribute head's outputs: how far the mean of ``watched`` rose since the run's first
    step beyond the rise of ``other`` (verbosity rising while helpfulness does not), each in units of its own
    first-step standard deviation. The first step that can say sets the baseline (a resumed run sets it again)."""

    def __init__(self, metric: str, watched: str, other: str) -> None:
        self.metric, self.watched, self.other = metric, watched, other  # the alarm, the two columns
        self.baseline: tuple[float, float, float, float] | None = None  # means and stds of the first step

    def value(self, columns: dict[str, np.ndarray]) -> float | None:
        """The step's value from its columns; None with fewer than ``MIN_SAMPLES`` scored samples or no spread."""
        watched, other = columns.get(self.watched), columns.get(self.other)
        if watched is None or other is None:
            return None
        both = np.isfinite(watched) & np.isfinite(other)
        if both.sum() < MIN_SAMPLES:
            return None
        watched, other = watched[both], other[both]
        if self.baseline is None:
            if watched.std() == 0 or other.std() == 0:
                return None
            self.baseline = (watched.mean(), other.mean(), watched.std(), other.std())
        w0, o0, w_std, o_std = self.baseline
        return float((watched.mean() - w0) / w_std - (other.mean() - o0) / o_std)


def warnings(metrics: dict[str, float], step: int) -> list[str]:
    """One line per alarm whose metric is in ``metrics`` and crosses its threshold."""
    lines = []
    for alarm in run_alarms(metrics):
        value = metrics.get(alarm.metric)
        if value is not None and alarm.tripped(value):
            side = ">" if alarm.above else "<"
            lines.append(f"vllm_rm alarm at step {step}: {alarm.metric} = {value:.3f} {side} {alarm.threshold} "
                         f"({alarm.meaning}): {alarm.advice}")
    return lines


def length_correlation(scores: np.ndarray, lengths: np.ndarray) -> float | None:
    """Pearson correlation of RM score and response length."""
    if len(scores) < MIN_SAMPLES or np.ptp(scores) == 0 or np.ptp(lengths) == 0:
        return None
    return float(np.corrcoef(scores, lengths)[0, 1])


def group_index(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order sorting samples by group, start of each group in that order, size of each group)."""
    _, inverse = np.unique(groups, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    sizes = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return order, starts, sizes


def same_group_pairs(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair (a, b), a != b, of samples of the same group, as two index arrays."""
    order, starts, sizes = group_index(groups)
    group_of = np.repeat(np.arange(len(sizes)), sizes)  # group of each position in ``order``
    counts = sizes[group_of]
    first = np.repeat(np.arange(len(order)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    second = np.repeat(starts[group_of], counts) + within
    keep = first != second
    return order[first[keep]], order[second[keep]]


def verifiable_disagreement(groups: np.ndarray, rm: np.ndarray, verifiable: np.ndarray) -> float | None:
    """Of the same-prompt pairs the verifier orders (a verified better than b), the share the RM orders
    the other way (b scored strictly above a); ``None`` with fewer than ``MIN_PAIRS`` such pairs."""
    a, b = same_group_pairs(groups)
    ordered = verifiable[a] > verifiable[b]
    if ordered.sum() < MIN_PAIRS:
        return None
    return float(np.mean(rm[b[ordered]] > rm[a[ordered]]))


def dead_groups(groups: np.ndarray, rewards: np.ndarray) -> float | None:
    """Share of groups (two samples or more) whose rewards are all equal."""
    order, starts, sizes = group_index(groups)
    multi = sizes >= 2
    if not multi.any():
        return None
    ordered = rewards[order]
    spread = np.maximum.reduceat(ordered, starts) - np.minimum.reduceat(ordered, starts)
    return float(np.mean(spread[multi] <= 1e-9))


def saturation(scores: np.ndarray, normalized: bool) -> float | None:
    """Share of scores pinned at an end of the scale: sigmoid (or the score, when the RM already returns
    probabilities) below ``PINNED`` or above ``1 - PINNED``."""
    if len(scores) == 0:
        return None
    if normalized:
        return float(np.mean((scores < PINNED) | (scores > 1 - PINNED)))
    return float(np.mean(np.abs(scores) > math.log((1 - PINNED) / PINNED)))


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    return (upper - (counts - 1) / 2.0)[inverse]


def drift(initial: np.ndarray, current: np.ndarray) -> dict[str, float]:
    """How far the RM moved on a fixed probe set: mean |change| and rank correlation (Spearman)."""
    out = {"drift/mean_abs_change": float(np.mean(np.abs(current - initial)))}
    if len(initial) >= 2 and np.ptp(initial) > 0 and np.ptp(current) > 0:
        out["alarm/drift_rank_corr"] = float(np.corrcoef(ranks(initial), ranks(current))[0, 1])
    return out
