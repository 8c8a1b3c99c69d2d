"""Reward config validation, the batch computation of rule rewards, composition and metrics."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from verl_vllm_rm.rewards import (
    RESPONSE_TOKENS,
    THOUGHT_TOKENS,
    NgramParams,
    RewardConfig,
    component_stats,
    compose,
    compute_rule_rewards,
    think_tag_ids,
)
from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.scoring.composition import Composition, right_padded


def test_default_is_the_rm_gallery_recipe():
    config = RewardConfig.from_dict(None)
    assert config == RewardConfig.from_dict({}) == RewardConfig()
    assert config.components == ("rubric", "format", "length", "ngram")
    assert dict(config.weights) == {"rubric": 0.95, "format": 0.05, "length": 1.0, "ngram": 1.0}
    assert config.ngram == NgramParams(ngram_size=5, max_penalty=-1.0, min_scaling=0.1)


def test_weights_default_per_component_and_can_be_overridden():
    config = RewardConfig.from_dict({
        "components": ["verifiable", "format", "thought_length", "gallery:reasoning_format"],
        "weights": {"verifiable": 2.0, "gallery:reasoning_format": 0},
        "ngram": {"ngram_size": 3},  # parameters of a disabled component are allowed (Hydra keeps defaults)
    })
    assert dict(config.weights) == {"verifiable": 2.0, "format": 0.05, "thought_length": 1.0,
                                    "gallery:reasoning_format": 0.0}
    assert config.gallery_names == ("reasoning_format",)
    assert config.ngram.ngram_size == 3


def test_from_dict_accepts_omegaconf_and_the_result_pickles():
    from omegaconf import OmegaConf

    raw = OmegaConf.create({"components": ["rubric", "format", "gallery:accuracy"], "weights": {"format": 0.2},
                            "format": {"blocks": ["reasoning", "answer"]}, "gallery": {"accuracy": {"name": "acc"}}})
    config = RewardConfig.from_dict(raw)
    assert config.format.blocks == ("reasoning", "answer")
    assert dict(config.weights) == {"rubric": 0.95, "format": 0.2, "gallery:accuracy": 1.0}
    assert pickle.loads(pickle.dumps(config)) == config  # reward-loop workers are Ray actors


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"components": ["rubric", "formt"]},
         r"unknown reward component 'formt'; valid: rubric, verifiable, judge, format, length, thought_length, ngram, "
         r"gallery:<name>"),
        ({"components": ["gallery:"]}, "unknown reward component 'gallery:'"),
        ({"components": ["rubric", 3]}, r"rewards\.components\[1\] must be a string, got 3"),
        ({"ngram": {"ngram_size": -2}}, r"rewards\.ngram: ngram_size must be a positive integer .*got -2"),
        ({"ngram": {"ngram_size": 0}}, r"rewards\.ngram: ngram_size must be a positive integer .*got 0"),
        ({"weights": {"thought_length": 0.5}},
         r"rewards: weights gives weights for \['thought_length'\], which are not enabled .*add them to components"),
        ({"components": ["rubric"], "weights": {"rubric": 1, "ngram": -1}}, r"weights for \['ngram'\]"),
        ({"weight": {"rubric": 1}},
         r"unknown rewards option\(s\) \['weight'\]; valid options are: components, weights, gate, format.*"
         r"did you mean 'weights' for 'weight'\?"),
        ({"ngram": {"n": 3}}, r"unknown rewards\.ngram option\(s\) \['n'\]; valid options are: ngram_size, max_penalty"),
        ({"ngram": [3]}, r"rewards\.ngram must be a mapping"),
        ({"components": "rubric"}, "rewards.components must be a list"),
        ({"components": []}, "non-empty list"),
        ({"components": ["format", "format"]}, r"lists \['format'\] more than once"),
        ({"weights": {"rubric": float("nan")}}, "weight of 'rubric' must be a finite number"),
        ({"weights": {"rubric": True}}, r"rewards\.weights\.rubric must be a number, got True"),
        ({"weights": [1.0]}, r"rewards\.weights must be a mapping of strings to numbers, got \[1\.0\]"),
        ({"length": {"overlong_buffer": 64}}, r"rewards\.length: overlong_buffer=64 needs max_response_tokens"),
        ({"thought_length": {"close_tag": ""}},
         r"rewards\.thought_length: open_tag and close_tag must be non-empty strings, got ''"),
        ({"format": {"pattern": "(unclosed"}}, r"rewards\.format: format pattern .* not a valid regular expression"),
        ({"gallery": {"length_penalty": 3}}, r"rewards\.gallery\.length_penalty must be a mapping of strings to values, got 3"),
        ({"gate": ["verifiable", "verifiable"]}, r"rewards: gate lists \['verifiable'\] more than once"),
        ({"gate": ["correct"]}, "rewards: unknown reward component 'correct'; valid: rubric, verifiable"),
        ({"gate": "verifiable"}, r"rewards\.gate must be a list of strings, got 'verifiable'"),
        ({"components": ["rubric", "verifiable"], "gate": ["verifiable"]},
         r"\['verifiable'\] are in both components and gate.*keep it in one of them"),
        ({"components": ["rubric"], "gate": ["verifiable"], "weights": {"verifiable": 1.0}},
         r"weights gives weights for \['verifiable'\].*\(gate components are not weighted\)"),
    ],
)
def test_config_errors_name_the_problem(raw, message):
    with pytest.raises(ConfigError, match=message):
        RewardConfig.from_dict(raw)


def test_a_config_built_in_python_checks_its_gate_too():
    """``RewardConfig(...)`` built directly (not through ``from_dict``'s type checks) still refuses a gate given as
    one string, naming the fix (read character by character it would be an unknown component 'v')."""
    with pytest.raises(ValueError, match=r"gate must be a list of names, got 'verifiable'; a string is not read as "
                                         r"one name: give \['verifiable'\]"):
        RewardConfig(components=("rubric",), gate="verifiable")
    assert RewardConfig(components=("rubric",), gate=["verifiable"]).gate == ("verifiable",)


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
    total = compose({"rubric": np.array([None, 1.0], dtype=float), "format": [1.0, 1.0]}, {"rubric": 1.0, "format": 1.0})
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


RUBRIC = np.array([1.5, -0.5, 2.0, 0.0])
VERIFIABLE = np.array([1.0, 0.0, 0.5, 1.0])


@pytest.mark.parametrize(
    "mode, expected, needs_verifiable",
    [
        ("replace", [1.5, -0.5, 2.0, 0.0], False),
        ("add", [2.5, -0.5, 2.5, 1.0], True),
        ("multiply", [1.5, 0.0, 1.0, 0.0], True),
        ("weighted", [0.25 * 1.5 + 0.75, 0.25 * -0.5, 0.25 * 2.0 + 0.75 * 0.5, 0.75], True),  # alpha = 0.25
    ],
)
def test_combine_shorthand_is_a_composition(word_tokenizer, mode, expected, needs_verifiable):
    config = RewardConfig.from_combine(mode, alpha=0.25)
    total = compose({"rubric": RUBRIC, "verifiable": VERIFIABLE}, config.weights, config.gate)
    np.testing.assert_allclose(total, expected)
    composition = Composition(config, word_tokenizer)
    # the manager calls compute_score only when needed and adds no rule keys to reward_extra_info
    assert (composition.needs_verifiable, composition.has_rules, composition.rule_keys) == (needs_verifiable, False, ())
    verifiable = np.array(VERIFIABLE if needs_verifiable else [None] * len(RUBRIC), dtype=float)
    got = composition.total({"rubric": np.array(RUBRIC), "verifiable": verifiable})
    np.testing.assert_allclose(got, expected)


def test_combine_shorthand_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match=r"combine='avg' is not one of \['replace', 'add', 'multiply', 'weighted'\]"):
        RewardConfig.from_combine("avg", alpha=0.5)


def test_rule_scorer_needs_verifiable_for_a_verifiable_gate(word_tokenizer):
    composition = Composition(RewardConfig.from_dict({"components": ["rubric", "ngram"], "gate": ["verifiable"]}),
                              word_tokenizer)
    assert (composition.needs_verifiable, composition.has_rules, composition.rule_keys) == (True, True, ("ngram",))


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


def test_rows_are_right_padded_into_one_batch_whatever_their_lengths():
    ids, lengths = right_padded([np.array([5, 6, 7]), np.array([], dtype=np.int64), np.array([8])])
    np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 0, 0], [8, 0, 0]])
    np.testing.assert_array_equal(lengths, [3, 0, 1])
    ids, lengths = right_padded([np.array([], dtype=np.int64)])  # no token at all: one column of padding
    assert ids.shape == (1, 1) and lengths.tolist() == [0]
