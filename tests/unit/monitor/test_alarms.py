"""Alarm math on crafted batches: each alarm trips on the batch built to trip it and stays quiet on a clean one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from verl_vllm_rm.monitor import alarms
from verl_vllm_rm.monitor.alarms import ALARMS, warnings
from verl_vllm_rm.monitor.metrics import StepRewards, alarm_metrics

RNG = np.random.default_rng(0)


def alarm(metric: str):
    return next(a for a in ALARMS if a.metric == metric)


def grpo_step(rm: np.ndarray, lengths: np.ndarray, group_size: int = 4, **columns) -> StepRewards:
    n = len(rm)
    cols = {"rm_score": rm, "score": columns.pop("score", rm), "rm_valid": np.ones(n), **columns}
    return StepRewards(np.array([f"g{i // group_size}" for i in range(n)]), lengths.astype(float), cols)


def test_length_hacking_trips_when_the_rm_pays_for_length_and_not_otherwise():
    lengths = RNG.integers(5, 200, size=64)
    hacked = alarm_metrics(grpo_step(0.02 * lengths + RNG.normal(0, 0.3, 64), lengths), normalized=False)
    clean = alarm_metrics(grpo_step(RNG.normal(0, 1, 64), lengths), normalized=False)
    assert hacked["alarm/length_hacking"] > 0.9 and alarm("alarm/length_hacking").tripped(hacked["alarm/length_hacking"])
    assert abs(clean["alarm/length_hacking"]) < 0.5
    assert any("alarm/length_hacking" in line for line in warnings(hacked, step=3))
    assert not any("alarm/length_hacking" in line for line in warnings(clean, step=3))


def test_length_correlation_needs_enough_samples_and_spread():
    assert alarms.length_correlation(np.arange(4.0), np.arange(4.0)) is None  # < MIN_SAMPLES
    assert alarms.length_correlation(np.ones(20), np.arange(20.0)) is None  # constant scores
    assert alarms.length_correlation(np.arange(20.0), np.full(20, 7.0)) is None  # constant lengths


def test_same_group_pairs_are_every_ordered_pair_within_each_group():
    groups = np.array(["b", "a", "b", "c", "a", "b"])
    a, b = alarms.same_group_pairs(groups)
    want = {(i, j) for i, j in itertools.permutations(range(6), 2) if groups[i] == groups[j]}
    assert set(zip(a.tolist(), b.tolist())) == want and len(a) == len(want)


def test_verifiable_disagreement_both_ways():
    right = np.tile([1.0, 0.0, 1.0, 0.0], 8)  # two verified-right and two verified-wrong answers per group
    lengths = np.full(32, 10)
    agree = alarm_metrics(grpo_step(right + RNG.normal(0, 0.1, 32), lengths, verifiable_score=right), False)
    disagree = alarm_metrics(grpo_step(-right + RNG.normal(0, 0.1, 32), lengths, verifiable_score=right), False)
    assert agree["alarm/verifiable_disagreement"] == 0.0
    assert disagree["alarm/verifiable_disagreement"] == 1.0
    assert alarm("alarm/verifiable_disagreement").tripped(disagree["alarm/verifiable_disagreement"])
    # groups the verifier does not order (all right) say nothing; without the column, no alarm
    assert alarms.verifiable_disagreement(np.array(["g"] * 4), np.arange(4.0), np.ones(4)) is None
    assert "alarm/verifiable_disagreement" not in alarm_metrics(grpo_step(right, lengths), False)


def test_verifiable_disagreement_counts_rm_ties_as_agreement_and_needs_enough_pairs():
    groups, verifiable = np.repeat(["g", "h"], 3), np.tile([1.0, 0.0, 0.0], 2)  # 2 ordered pairs a group
    assert alarms.verifiable_disagreement(groups, np.full(6, 0.5), verifiable) == 0.0
    assert alarms.verifiable_disagreement(groups, np.tile([0.4, 0.5, 0.3], 2), verifiable) == 0.5
    assert alarms.verifiable_disagreement(groups[:3], np.array([0.4, 0.5, 0.6]), verifiable[:3]) is None


def test_dead_groups_both_ways():
    lengths = np.full(16, 10)
    dead = alarm_metrics(grpo_step(RNG.normal(size=16), lengths, score=np.repeat([1.0, 0.0, 2.0, 2.0], 4)), False)
    live = alarm_metrics(grpo_step(RNG.normal(size=16), lengths, score=np.arange(16.0)), False)
    half = alarm_metrics(grpo_step(RNG.normal(size=16), lengths,
                                   score=np.concatenate([np.ones(8), np.arange(8.0)])), False)
    assert dead["alarm/dead_groups"] == 1.0 and alarm("alarm/dead_groups").tripped(1.0)
    assert live["alarm/dead_groups"] == 0.0 and half["alarm/dead_groups"] == 0.5
    assert not alarm("alarm/dead_groups").tripped(0.5)  # the threshold is a strict bound
    assert alarms.dead_groups(np.array(["a", "b"]), np.array([1.0, 1.0])) is None  # n=1: no groups


def test_saturation_on_raw_logits_and_on_probabilities():
    lengths = np.full(20, 10)
    pinned = alarm_metrics(grpo_step(np.tile([6.0, -6.0], 10), lengths), normalized=False)
    spread = alarm_metrics(grpo_step(np.linspace(-3, 3, 20), lengths), normalized=False)
    assert pinned["alarm/saturation"] == 1.0 and spread["alarm/saturation"] == 0.0
    probs = np.array([0.995] * 15 + [0.5] * 5)
    assert alarms.saturation(probs, normalized=True) == 0.75
    assert alarms.saturation(probs, normalized=False) == 0.0  # 0.995 as a logit is not pinned
    assert alarm("alarm/saturation").tripped(0.75) and not alarm("alarm/saturation").tripped(0.0)


def test_drift_both_ways():
    initial = RNG.normal(size=64)
    same = alarms.drift(initial, initial + 0.01)
    flipped = alarms.drift(initial, -initial)
    assert same["drift/mean_abs_change"] == pytest.approx(0.01) and same["alarm/drift_rank_corr"] == pytest.approx(1.0)
    assert flipped["alarm/drift_rank_corr"] == pytest.approx(-1.0)
    assert warnings(flipped, 5) and not warnings(same, 5)
    assert "alarm/drift_rank_corr" not in alarms.drift(np.ones(4), np.arange(4.0))  # no spread: no correlation


def test_ranks_share_ties():
    assert alarms.ranks(np.array([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_a_warning_line_names_metric_value_threshold_and_advice():
    (line,) = warnings({"alarm/dead_groups": 0.75, "alarm/saturation": 0.1, "reward/score/mean": 9.0}, step=12)
    assert line.startswith("vllm_rm alarm at step 12: alarm/dead_groups = 0.750 > 0.5")
    assert "rollout.n" in line


def attribute_step(verbosity: np.ndarray, helpfulness: np.ndarray) -> StepRewards:
    n = len(verbosity)
    return grpo_step(RNG.normal(0, 1, n), np.full(n, 10), rm_attr_rm_verbosity=verbosity,
                     rm_attr_rm_helpfulness=helpfulness)


def test_an_attribute_rising_without_the_other_trips_its_alarm_and_rising_together_does_not():
    from verl_vllm_rm.monitor.metrics import attribute_rises, step_metrics
    from verl_vllm_rm.scoring.options import AttributeAlarmOptions

    metric = "alarm/attribute_rise/rm/verbosity_over_helpfulness"
    verbosity, helpfulness = RNG.normal(0, 1, 64), RNG.normal(0, 2, 64)
    (rise,) = attribute_rises([AttributeAlarmOptions(watch="verbosity", against="helpfulness")])
    first = step_metrics(attribute_step(verbosity, helpfulness), False, [rise])
    assert first[metric] == 0.0 and first["reward/rm_attr_rm_verbosity/mean"] == pytest.approx(verbosity.mean())
    std = (verbosity.std(), helpfulness.std())
    hacked = step_metrics(attribute_step(verbosity + 2 * std[0], helpfulness), False, [rise])
    assert hacked[metric] == pytest.approx(2.0)
    (line,) = [w for w in warnings(hacked, step=7) if metric in w]
    assert line.startswith(f"vllm_rm alarm at step 7: {metric} = 2.000 > 1.0 (how far the watched attribute's")
    together = step_metrics(attribute_step(verbosity + 2 * std[0], helpfulness + 2 * std[1]), False, [rise])
    assert together[metric] == pytest.approx(0.0, abs=1e-9) and not [w for w in warnings(together, 8) if metric in w]
    few = step_metrics(attribute_step(verbosity[:4], helpfulness[:4]), False, [rise])
    assert metric not in few  # fewer than MIN_SAMPLES: the step cannot say


def test_the_attribute_rise_waits_for_a_first_step_with_spread():
    rise = alarms.AttributeRise("alarm/attribute_rise/rm/a_over_b", "a", "b")
    assert rise.value({"a": np.ones(16), "b": np.arange(16.0)}) is None and rise.baseline is None
    assert rise.value({"b": np.arange(16.0)}) is None  # a step without the column
    assert rise.value({"a": np.arange(16.0), "b": np.arange(16.0)}) == 0.0 and rise.baseline is not None
