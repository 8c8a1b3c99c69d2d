"""Per-step reward metrics from the manager's per-sample columns."""

from __future__ import annotations

import numpy as np
import pytest

from verl_vllm_rm.monitor.metrics import StepRewards, step_metrics


def rows():
    """Four samples of two prompts; the third's RM score failed (masked)."""
    return [
        {"score": 1.5, "rm_score": 0.5, "rm_valid": 1.0, "rm_latency_ms": 10.0, "rm_tokens": 30.0,
         "rm_weight_version": 2.0, "rm_prompt_tokens_dropped": 0.0, "format": 1.0, "pred": "42"},
        {"score": -0.5, "rm_score": -1.5, "rm_valid": 1.0, "rm_latency_ms": 20.0, "rm_tokens": 40.0,
         "rm_weight_version": 3.0, "rm_prompt_tokens_dropped": 4.0, "format": 1.0, "pred": "7"},
        {"score": 0.0, "rm_score": 0.0, "rm_valid": 0.0, "rm_latency_ms": 900.0, "rm_tokens": 50.0,
         "rm_weight_version": -1.0, "rm_prompt_tokens_dropped": 0.0, "format": 0.0, "pred": "1"},
        {"score": 2.0, "rm_score": 2.0, "rm_valid": 1.0, "rm_latency_ms": 30.0, "rm_tokens": 60.0,
         "rm_weight_version": 3.0, "rm_prompt_tokens_dropped": 0.0, "format": 0.0, "pred": "3"},
    ]


def test_every_metric_of_a_step():
    step = StepRewards.from_rows(["a", "a", "b", "b"], [5, 6, 7, 8], rows())
    m = step_metrics(step, normalized=False)
    valid_rm = np.array([0.5, -1.5, 2.0])
    assert m["reward/rm_score/mean"] == pytest.approx(valid_rm.mean())  # the masked sample's 0.0 is no score
    assert m["reward/rm_score/std"] == pytest.approx(valid_rm.std())
    assert (m["reward/score/min"], m["reward/score/max"]) == (-0.5, 2.0)
    assert m["reward/format/mean"] == 0.5  # rule components count every sample
    assert m["reward/rm_valid_share"] == 0.75 and m["reward/rm_failures"] == 1.0
    assert m["reward/rm_latency_ms/p50"] == pytest.approx(25.0)
    assert m["reward/rm_latency_ms/p99"] == pytest.approx(np.percentile([10, 20, 900, 30], 99))
    assert m["reward/rm_tokens"] == 180.0 and m["reward/rm_prompt_tokens_dropped"] == 4.0
    assert (m["reward/rm_weight_version/min"], m["reward/rm_weight_version/max"]) == (2.0, 3.0)
    assert not [k for k in m if "pred" in k or k.startswith(("reward/rm_valid/", "reward/rm_tokens/"))]
    assert m["alarm/saturation"] == 0.0 and "alarm/length_hacking" not in m  # 3 valid samples: too few


def test_columns_are_floats_with_nan_where_a_row_lacks_one():
    rows = [{"rm_valid": 1.0, "rm_score": 0.5, "win": 1.0}, {"rm_valid": 1.0, "rm_score": 0.1},
            {"rm_valid": 1.0, "rm_score": 0.2, "win": None}]
    step = StepRewards.from_rows(["a", "b", "c"], [1, 2, 3], rows)
    assert step.columns["win"][0] == 1.0 and np.isnan(step.columns["win"][1:]).all()
    assert step_metrics(step, normalized=False)["reward/win/mean"] == 1.0
    assert step.groups.tolist() == ["a", "b", "c"]


def test_rewards_not_from_vllm_rm_are_named():
    step = StepRewards.from_rows(["a"], [1], [{"score": 1.0}])
    with pytest.raises(KeyError, match=r"no rm_valid column: these rewards are not from "
                                       r"reward\.reward_manager\.name=vllm_rm"):
        step_metrics(step, normalized=False)


def test_a_step_whose_every_rm_score_failed_still_reports():
    """failure_policy=mask and the server down for a whole step: the health metrics say so, nothing raises."""
    infos = [dict(row, rm_valid=0.0, rm_score=0.0, score=0.0, rm_weight_version=-1.0) for row in rows()]
    m = step_metrics(StepRewards.from_rows(["a", "a", "b", "b"], [5, 6, 7, 8], infos), normalized=False)
    assert m["reward/rm_valid_share"] == 0.0 and m["reward/rm_failures"] == 4.0
    assert np.isnan(m["reward/rm_score/mean"]) and "reward/rm_weight_version/max" not in m
    assert m["alarm/dead_groups"] == 1.0 and "alarm/saturation" not in m and "alarm/length_hacking" not in m


def test_samples_routed_to_no_reward_model_are_neither_valid_nor_failed():
    """A route without RMs (rm_valid None): its samples count in score and rule stats, not in the RM's health."""
    no_rm = {"score": 1.0, "rm_score": None, "rm_valid": None, "rm_latency_ms": None, "rm_tokens": 0.0,
             "rm_weight_version": None, "rm_prompt_tokens_dropped": 0.0, "format": 1.0, "pred": "0"}
    step = StepRewards.from_rows(["a", "a", "b", "b", "c", "c"], [5, 6, 7, 8, 9, 9], rows() + [no_rm, no_rm])
    m = step_metrics(step, normalized=False)
    assert m["reward/rm_valid_share"] == 0.75 and m["reward/rm_failures"] == 1.0
    assert m["reward/rm_score/mean"] == pytest.approx(np.mean([0.5, -1.5, 2.0]))
    assert m["reward/score/mean"] == pytest.approx(np.mean([1.5, -0.5, 2.0, 1.0, 1.0]))  # the masked one is left out
    assert m["reward/rm_latency_ms/p50"] == pytest.approx(25.0)
    assert m["alarm/dead_groups"] == pytest.approx(1 / 3)  # group c: both 1.0
