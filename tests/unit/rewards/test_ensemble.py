"""The ensemble of several RMs' scores and the running whitening (``rewards/ensemble.py``), against their
written-out definitions."""

import math

import numpy as np
import pytest

from verl_vllm_rm.rewards.ensemble import Moments, RunningWhitening, ensemble

SCORES = np.array([[1.0, 3.0, 8.0], [2.0, np.nan, 4.0], [np.nan, np.nan, np.nan], [-1.0, -1.0, -1.0]])


@pytest.mark.parametrize(("method", "want"), [
    ("mean", [4.0, 3.0, np.nan, -1.0]),
    ("min", [1.0, 2.0, np.nan, -1.0]),
    ("median", [3.0, 3.0, np.nan, -1.0]),
    ("mean_minus_std", [4.0 - 0.5 * math.sqrt(26 / 3), 3.0 - 0.5 * 1.0, np.nan, -1.0]),
])
def test_ensemble_over_the_members_present(method, want):
    value, std = ensemble(SCORES, method, uncertainty_penalty=0.5)
    assert np.allclose(value, want, equal_nan=True)
    assert np.allclose(std, [math.sqrt(26 / 3), 1.0, np.nan, 0.0], equal_nan=True)  # population std


def test_no_member_present_is_nan_never_a_number():
    value, std = ensemble(np.full((1, 2), np.nan), "mean")
    assert np.isnan(value[0]) and np.isnan(std[0])


def test_unknown_ensemble_is_an_error():
    with pytest.raises(ValueError, match="'max' is not one of"):
        ensemble(SCORES, "max")


def test_running_whitening_is_welford_over_every_score_seen():
    rng = np.random.default_rng(0)
    xs = rng.normal(5.0, 3.0, size=50)
    w = RunningWhitening()
    assert w.update_and_whiten(xs[0]) == 0.0 and w.std == 1.0  # one score: no spread known yet
    for i, x in enumerate(xs[1:], start=2):
        got = w.update_and_whiten(x)
        assert got == pytest.approx((x - xs[:i].mean()) / xs[:i].std())
    state = w.state()
    assert state["count"] == 50
    assert state["mean"] == pytest.approx(xs.mean()) and state["std"] == pytest.approx(xs.std())
    assert w.whiten(1.0) == pytest.approx((1.0 - xs.mean()) / xs.std()) and w.count == 50  # whiten alone adds nothing


def moments_of(xs) -> Moments:
    m = Moments()
    for x in xs:
        m.add(float(x))
    return m


@pytest.mark.parametrize("split", [(0, 0), (0, 7), (1, 1), (5, 2), (13, 40)])
def test_merged_moments_are_those_of_both_streams(split):
    """Chan's update: the moments of two shares merged equal the moments of the whole stream (any sizes,
    an empty share included), whichever order they merge in."""
    rng = np.random.default_rng(sum(split))
    a, b = rng.normal(3.0, 2.0, split[0]), rng.normal(-1.0, 5.0, split[1])
    whole = np.concatenate([a, b])
    for merged in (moments_of(a).merged(moments_of(b)), moments_of(b).merged(moments_of(a))):
        assert merged.count == len(whole)
        if len(whole):
            assert merged.mean == pytest.approx(whole.mean())
            assert merged.m2 == pytest.approx(((whole - whole.mean()) ** 2).sum())


def test_whitening_from_a_prior_counts_it_once():
    """A worker resumed from saved statistics whitens on prior + its own scores, and reports only its own
    (``seen``), so merging the workers' reports with the prior counts the prior once."""
    rng = np.random.default_rng(1)
    before, after = rng.normal(2.0, 4.0, 30), rng.normal(2.5, 4.0, 10)
    w = RunningWhitening(moments_of(before))
    for i, x in enumerate(after, start=1):
        seen = np.concatenate([before, after[:i]])
        assert w.update_and_whiten(x) == pytest.approx((x - seen.mean()) / seen.std())
    assert w.seen.count == 10 and w.seen.mean == pytest.approx(after.mean())
    assert w.prior.merged(w.seen).mean == pytest.approx(np.concatenate([before, after]).mean())
    with pytest.raises(RuntimeError, match="whitening has already seen 10 scores: a prior must come first"):
        w.start_from(moments_of(before))
    fresh = RunningWhitening()
    fresh.start_from(moments_of(before))
    assert fresh.whiten(0.0) == pytest.approx(-before.mean() / before.std()) and fresh.seen.count == 0


@pytest.mark.parametrize("state, problem", [
    ({"count": 3, "mean": 1.0}, "need count, mean and m2"),
    ({"count": "x", "mean": 1.0, "m2": 1.0}, "need count, mean and m2"),
    ([1, 2, 3], "need count, mean and m2"),
    ({"count": -1, "mean": 0.0, "m2": 0.0}, "integer count >= 0"),
    ({"count": 2.5, "mean": 0.0, "m2": 0.0}, "integer count >= 0"),
    ({"count": 2, "mean": float("nan"), "m2": 0.0}, "finite mean"),
    ({"count": 2, "mean": 0.0, "m2": -1.0}, "m2 >= 0"),
])
def test_saved_moments_that_are_not_statistics_are_refused(state, problem):
    with pytest.raises(ValueError, match=f"whitening.json, 'rm'.*{problem}"):
        Moments.from_dict(state, "whitening.json, 'rm'")
