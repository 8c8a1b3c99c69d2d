"""Pairwise validation against reference answers, through verl's loader: the config and failure cases that need
no server (those on the real server: tests/integration/scoring/test_pairwise.py)."""

import pytest
from reference_groups import reference_groups, validation_batch


@pytest.fixture(scope="module")
def ref_groups(tokenizer):
    return reference_groups(tokenizer)


def test_bad_reference_source_is_a_config_error(load_manager, verl_config, tokenizer):
    from verl_vllm_rm.scoring.options import ConfigError

    with pytest.raises(ConfigError, match="reference_source='answer' is not one of"):
        load_manager(verl_config("http://127.0.0.1:1", reference_source="answer"), tokenizer)


def test_mask_policy_covers_the_reference_score_too(load_manager, dead_url, verl_config, tokenizer, ref_groups):
    cfg = verl_config(dead_url, max_retries=0, failure_policy="mask", max_length=512)
    mgr = load_manager(cfg, tokenizer)
    info = mgr(validation_batch(ref_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    assert info["rm_valid"] == [0.0] * 9 and info["win"] == [None] * 9
