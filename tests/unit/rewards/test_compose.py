"""The batch computation of rule rewards (``rewards/compose.py``): ``compute_rule_rewards`` and the keys it returns,
the weighted, gated ``compose`` and the metrics of ``component_stats``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from verl_vllm_rm.rewards import (
    RESPONSE_TOKENS,
    THOUGHT_TOKENS,
    RewardConfig,
    component_stats,
    compose,
    compute_rule_rewards,
    think_tag_ids,
)
from verl_vllm_rm.rewards.compose import rule_keys


def test_compose_is_the_weighted_sum():
    values = {"rubric": np.array([1.0, 0.0, 0.5]), "format": [1, 0, 1], "ngram": np.array([0.0, -1.0, -0.2]),
              RESPONSE_TOKENS: np.array([10.0, 20.0, 30.0])}  # unweighted extras are ignored
    total = compose(values, {"rubric": 0.95, "format": 0.05, "ngram": 1.0})
    np.testing.assert_allclose(total, [1.0, -1.0, 0.95 * 0.5 + 0.05 - 0.2])
    assert total.dtype == np.float64


def test_compose_keeps_nan_and_reports_missing_or_mismatched_values():
    total = compose({"rubric": [np.nan, 1.0], "format": [1.0, 1.0]}, {"rubric": 1.0, "format": 1.0})
    assert math.isnan(total[0]) and total[1] == 2.0
    with pytest.raises(ValueError, match=r"no values for weighted component\(s\) \['rubric'\].*manager supplies"):
        compose({"format": [1.0]}, {"rubric": 0.95, "format": 0.05})
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        compose({"rubric": [1.0, 2.0], "format": [1.0]}, {"rubric": 1.0, "format": 1.0})
    with pytest.raises(ValueError, match="at least one weighted component"):
        compose({"rubric": [1.0]}, {})


def test_gate_multiplies_the_weighted_sum():
    values = {"rubric": [2.0, -1.0, 0.5], "format": [1.0, 1.0, 0.0], "verifiable": [1.0, 0.0, 0.5]}
    total = compose(values, {"rubric": 0.5, "format": 0.25}, gate=["verifiable", "format"])
    # (0.5 * rubric + 0.25 * format) * verifiable * format, by hand
    np.testing.assert_allclose(total, [(1.0 + 0.25) * 1.0 * 1.0, (-0.5 + 0.25) * 0.0 * 1.0, 0.25 * 0.5 * 0.0])
    with pytest.raises(ValueError, match=r"no values for gate component\(s\) \['verifiable'\].*manager supplies"):
        compose({"rubric": [1.0]}, {"rubric": 1.0}, gate=["verifiable"])


def test_compose_reads_arrays_only_and_a_missing_value_stays_nan():
    """The pipeline composes a whole list of rows at once: one path, over arrays; None (no value) is NaN, never 0."""
    total = compose({"rubric": np.array([None, 1.0], dtype=float), "format": [1.0, 1.0]},
                    {"rubric": 1.0, "format": 1.0})
    assert math.isnan(total[0]) and total[1] == 2.0
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        compose({"rubric": 1.0}, {"rubric": 1.0})


def test_gate_components_are_computed_but_not_weighted(padded):
    config = RewardConfig.from_dict({"components": ["rubric"], "gate": ["format"]})
    assert (config.components, config.gate, dict(config.weights)) == (("rubric",), ("format",), {"rubric": 0.95})
    texts = ["<think>a</think><answer>b</answer>", "no tags"]
    ids, lengths = padded([[1, 2], [3]])
    values = compute_rule_rewards(config, ids, lengths, texts)
    np.testing.assert_array_equal(values["format"], [1.0, 0.0])
    values["rubric"] = np.array([0.4, 0.8])
    np.testing.assert_allclose(compose(values, config.weights, config.gate), [0.95 * 0.4, 0.0])


def test_component_stats():
    stats = component_stats({"ngram": np.array([0.0, -1.0, -0.5, np.nan]), "rubric": [np.nan]})
    assert stats["reward/ngram/mean"] == pytest.approx(-0.5)
    assert stats["reward/ngram/std"] == pytest.approx(np.std([0.0, -1.0, -0.5]))
    assert (stats["reward/ngram/min"], stats["reward/ngram/max"]) == (-1.0, 0.0)
    names = [f"reward/{n}/{s}" for n in ("ngram", "rubric") for s in ("mean", "std", "min", "max")]
    assert sorted(stats) == sorted(names)
    assert all(math.isnan(stats[f"reward/rubric/{s}"]) for s in ("mean", "std", "min", "max"))


def test_compute_rule_rewards_end_to_end(word_tokenizer, padded):
    config = RewardConfig.from_dict({
        "components": ["rubric", "format", "length", "thought_length", "ngram"],
        "length": {"max_tokens": 8, "penalty_per_token": 0.5, "max_response_tokens": 12, "overlong_buffer": 4},
        "thought_length": {"min_tokens": 2, "penalty_per_token": 0.25},
        "ngram": {"ngram_size": 2, "min_scaling": 0.0},
    })
    texts = [
        "<think>a b c</think> <answer> answer </answer>",  # 8 tokens (answer tags are unknown words), thought 3
        "<think>a a a a a a a a a a",  # 11 tokens, truncated thought of 10, all one bigram
        "the answer",  # no think block
    ]
    ids, lengths = padded([word_tokenizer.encode(t, add_special_tokens=False) for t in texts], pad=-1, width=16)
    np.testing.assert_array_equal(lengths, [8, 11, 2])
    tags = think_tag_ids(word_tokenizer, config.thought_length.open_tag, config.thought_length.close_tag)
    values = compute_rule_rewards(config, ids, lengths, texts, tags)
    assert list(values) == ["format", "length", RESPONSE_TOKENS, "thought_length", THOUGHT_TOKENS, "ngram"]
    np.testing.assert_array_equal(values["format"], [1.0, 0.0, 0.0])
    # 8 tokens: at both limits (band max 8, overlong ramp starts at 12 - 4); 11: 3 over the band + 3/4 of the ramp
    np.testing.assert_allclose(values["length"], [0.0, -1.5 - 0.75, 0.0])
    np.testing.assert_array_equal(values[RESPONSE_TOKENS], [8, 11, 2])
    np.testing.assert_array_equal(values[THOUGHT_TOKENS], [3, 10, 0])
    np.testing.assert_array_equal(values["thought_length"], [0.0, 0.0, -0.5])
    np.testing.assert_allclose(values["ngram"], [0.0, -8 / 9, 0.0])  # 10 bigrams, 2 distinct: (10-2)/(10-1)
    values["rubric"] = np.array([0.5, 0.9, 0.1])
    np.testing.assert_allclose(compose(values, config.weights), [
        0.95 * 0.5 + 0.05,
        0.95 * 0.9 - 2.25 - 8 / 9,
        0.95 * 0.1 - 0.5,
    ])


def test_compute_rule_rewards_input_errors(padded):
    config = RewardConfig.from_dict({"components": ["thought_length"]})
    ids, lengths = padded([[1, 2], [3]])
    with pytest.raises(ValueError, match=r"thought_length needs think_tags: pass spans\.think_tag_ids\(tokenizer, "
                                         r"config\.thought_length\.open_tag, config\.thought_length\.close_tag\)"):
        compute_rule_rewards(config, ids, lengths, ["x", "y"])
    with pytest.raises(ValueError, match="3 texts for 2 token rows"):
        compute_rule_rewards(config, ids, lengths, ["x", "y", "z"])


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
