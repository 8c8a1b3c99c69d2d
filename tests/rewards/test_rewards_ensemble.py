"""The ensemble of several RMs' scores and the running whitening, against their written-out definitions."""

import math

import numpy as np
import pytest

from verl_vllm_rm.rewards import RewardConfig, compute_rule_rewards
from verl_vllm_rm.rewards.compose import rule_keys
from verl_vllm_rm.rewards.ensemble import RunningWhitening, ensemble

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
    assert state["count"] == 50 and state["mean"] == pytest.approx(xs.mean()) and state["std"] == pytest.approx(xs.std())
    assert w.whiten(1.0) == pytest.approx((1.0 - xs.mean()) / xs.std()) and w.count == 50  # whiten alone adds nothing


@pytest.mark.parametrize("components", [["rubric"], ["format", "length", "ngram"], ["thought_length", "verifiable"],
                                        ["length", "thought_length", "format"]])
def test_rule_keys_are_what_compute_rule_rewards_returns(tokenizer_free_tags, components):
    config = RewardConfig(components=tuple(components))
    values = compute_rule_rewards(config, np.array([[5, 6, 7]]), np.array([3]), ["<think>a</think> b"],
                                  tokenizer_free_tags)
    assert sorted(rule_keys(config)) == sorted(values)


@pytest.fixture()
def tokenizer_free_tags():
    from verl_vllm_rm.rewards.spans import ThinkTagIds

    return ThinkTagIds(open=(1,), close=(2,))
