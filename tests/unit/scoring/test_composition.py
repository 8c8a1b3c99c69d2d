"""One reward composition as the pipeline uses it (``scoring/composition.py``): rows of any length right-padded into
one batch, what a composition needs (text, ``compute_score``, the judge), its rule components over the rows, and its
total over component arrays, on the tiny RM's tokenizer."""

from __future__ import annotations

import math

import numpy as np

from verl_vllm_rm.extra_info import RESPONSE_TOKENS, THOUGHT_TOKENS
from verl_vllm_rm.rewards import RewardConfig, ThinkTagIds
from verl_vllm_rm.scoring.composition import Composition, right_padded


def test_rule_scorer_needs_verifiable_for_a_verifiable_gate(tokenizer):
    composition = Composition(RewardConfig.from_dict({"components": ["rubric", "ngram"], "gate": ["verifiable"]}),
                              tokenizer)
    assert (composition.needs_verifiable, composition.has_rules, composition.rule_keys) == (True, True, ("ngram",))


def test_rows_are_right_padded_into_one_batch_whatever_their_lengths():
    ids, lengths = right_padded([np.array([5, 6, 7]), np.array([], dtype=np.int64), np.array([8])])
    np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 0, 0], [8, 0, 0]])
    np.testing.assert_array_equal(lengths, [3, 0, 1])
    ids, lengths = right_padded([np.array([], dtype=np.int64)])  # no token at all: one column of padding
    assert ids.shape == (1, 1) and lengths.tolist() == [0]



def test_what_a_composition_needs_follows_its_components(tokenizer):
    rubric = Composition(RewardConfig(components=("rubric",)), tokenizer)
    assert (rubric.has_rules, rubric.needs_text, rubric.needs_verifiable, rubric.needs_judge) == (False,) * 4
    assert (rubric.rule_keys, rubric.tags, rubric.gallery) == ((), None, {})  # nothing computed here
    judge = Composition(RewardConfig(components=("rubric", "judge")), tokenizer)
    assert (judge.has_rules, judge.needs_text, judge.needs_judge) == (False, True, True)
    verifiable = Composition(RewardConfig(components=("verifiable",)), tokenizer)
    assert (verifiable.has_rules, verifiable.needs_text, verifiable.needs_verifiable) == (False, True, True)
    rules = Composition(RewardConfig(components=("rubric", "format")), tokenizer)
    assert (rules.has_rules, rules.needs_text, rules.rule_keys) == (True, True, ("format",))


def test_rule_components_over_rows_of_any_length_and_the_total_over_their_arrays(tokenizer):
    config = RewardConfig.from_dict({"components": ["rubric", "length", "thought_length"],
                                     "length": {"max_tokens": 8, "penalty_per_token": 0.5},
                                     "thought_length": {"min_tokens": 2, "penalty_per_token": 0.25}})
    composition = Composition(config, tokenizer)
    open_ids = tuple(tokenizer.encode("<think>", add_special_tokens=False))
    close_ids = tuple(tokenizer.encode("</think>", add_special_tokens=False))
    assert composition.tags == ThinkTagIds(open_ids, close_ids)
    assert composition.rule_keys == ("length", "thought_length", RESPONSE_TOKENS, THOUGHT_TOKENS)
    body = [69, 314, 294]
    rows = [np.array([*open_ids, *body, *close_ids, 5]), np.array([], dtype=np.int64), np.array([5, 6, 7, 8, 9, 10])]
    assert [len(r) for r in rows] == [len(open_ids) + 3 + len(close_ids) + 1, 0, 6]
    values = composition.rule_components(rows, ["x", "", "y"], ["", "", ""], [None, None, None])
    assert sorted(values) == sorted(composition.rule_keys)
    over_band = len(rows[0]) - 8
    np.testing.assert_allclose(values["length"], [-0.5 * over_band, 0.0, 0.0])
    np.testing.assert_array_equal(values[RESPONSE_TOKENS], [len(rows[0]), 0, 6])
    np.testing.assert_array_equal(values[THOUGHT_TOKENS], [3, 0, 0])
    np.testing.assert_allclose(values["thought_length"], [0.0, -0.5, -0.5])  # 2 tokens short of min_tokens
    total = composition.total({**values, "rubric": np.array([1.0, np.nan, 0.5])})
    assert total[0] == -0.5 * over_band + 0.95 * 1.0
    assert math.isnan(total[1])  # a missing RM score stays missing
    assert total[2] == 0.95 * 0.5 - 0.5


def test_gallery_rewards_score_each_row_against_its_reference_and_a_row_without_one_fails_it(tokenizer):
    composition = Composition(RewardConfig(components=("gallery:accuracy",)), tokenizer)
    assert list(composition.gallery) == ["accuracy"] and composition.needs_text
    ids = [np.array([5, 6]), np.array([7])]
    values = composition.rule_components(ids, ["42", "42"], ["q", "q"], ["42", None])
    np.testing.assert_array_equal(values["gallery:accuracy"], [1.0, 0.0])
