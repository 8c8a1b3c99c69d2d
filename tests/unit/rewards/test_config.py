"""The reward composition config (``rewards/config.py``): the recipe defaults, weights per component, every
validation error, and the ``combine``/``alpha`` shorthand as a composition."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.rewards import NgramParams, RewardConfig, compose
from verl_vllm_rm.scoring.composition import Composition



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
        ({"ngram": {"n": 3}},
         r"unknown rewards\.ngram option\(s\) \['n'\]; valid options are: ngram_size, max_penalty"),
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
        ({"gallery": {"length_penalty": 3}},
         r"rewards\.gallery\.length_penalty must be a mapping of strings to values, got 3"),
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
