"""The ``reward_extra_info`` schema (``verl_vllm_rm/extra_info.py``): the column names a run writes and the monitor
reads, each group's names distinct, and the per-RM, per-attribute keys spelled as docs/metrics.md names them."""

from __future__ import annotations

from verl_vllm_rm import extra_info as keys


def test_the_column_groups_hold_distinct_names_and_no_two_groups_share_one():
    groups = {"rm": keys.RM_KEYS, "judge": keys.JUDGE_KEYS, "win": keys.WIN_KEYS,
              "rule lengths": (keys.RESPONSE_TOKENS, keys.THOUGHT_TOKENS),
              "verifiable": (keys.VERIFIABLE_SCORE, *keys.DEFAULT_SCORER_KEYS),
              "composed": (keys.SCORE, keys.TOKEN_REWARDS, keys.RM_ENSEMBLE_STD)}
    every = [name for names in groups.values() for name in names]
    assert len(every) == len(set(every)), every
    assert set(keys.BOOKKEEPING) == set(keys.RM_KEYS) - {keys.RM_SCORE}  # every RM column but the score itself
    assert keys.NUMBER_KEY in keys.DEFAULT_SCORER_KEYS  # verl's naive manager's column of a number compute_score gives


def test_the_columns_keep_the_names_runs_and_the_monitor_know():
    assert keys.RM_KEYS == ("rm_score", "rm_valid", "rm_prompt_tokens_dropped", "rm_tokens", "rm_latency_ms",
                            "rm_weight_version", "rm_failovers")
    assert keys.JUDGE_KEYS == ("judge_score", "judge_valid", "judge_rank", "judge_raw", "judge_verdicts",
                               "judge_answer")
    assert keys.WIN_KEYS == ("win", "win_and", "ref_margin")
    assert (keys.SCORE, keys.VERIFIABLE_SCORE, keys.NUMBER_KEY) == ("score", "verifiable_score", "acc")


def test_each_rm_and_attribute_gets_keys_of_its_own():
    assert keys.member_keys("helpful") == ("rm_score_helpful", "rm_valid_helpful", "rm_weight_version_helpful")
    assert keys.member_scaled_key("helpful") == "rm_scaled_helpful"
    assert keys.attribute_key("attrs", "verbosity") == "rm_attr_attrs_verbosity"
    assert keys.scaled_attribute_key("attrs", "verbosity") == "rm_attr_scaled_attrs_verbosity"
    assert keys.ensembled_attribute_keys("verbosity") == ("rm_ensemble_attr_verbosity", "rm_ensemble_std_verbosity")


def test_an_rms_weight_version_is_its_own_column_only_with_per_member_columns():
    assert keys.weight_version_key("helpful", per_member=True) == "rm_weight_version_helpful"
    # without per-member columns the run has one RM, whose version is the route's
    assert keys.weight_version_key("helpful", per_member=False) == keys.RM_WEIGHT_VERSION == "rm_weight_version"
