"""Pairwise validation against reference answers, through verl's loader on the real server."""

import asyncio

import numpy as np
import pytest

from reference_groups import reference_groups, validation_batch

from verl_vllm_rm.client.reward_client import VLLMRewardClient
from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.scoring.pairwise import MissingReferenceError


@pytest.fixture(scope="module")
def ref_groups(tokenizer):
    return reference_groups(tokenizer)


def direct_scores(url, groups, tokenizer):
    """Server scores of each response and of each reference, straight from the client."""
    client = VLLMRewardClient(url)

    async def go():
        try:
            rows = [g.prompt_ids + r for g in groups for r in g.response_ids]
            refs = [g.prompt_ids + tokenizer(g.ground_truth, add_special_tokens=False).input_ids for g in groups]
            return await client.score_batch(rows), await client.score_batch(refs)
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.parametrize("source", ["ground_truth", "extra_info:answer", "rm_gallery"])
def test_win_rates_match_direct_computation(load_manager, fault_proxy, verl_config, tokenizer, ref_groups, source):
    mgr = load_manager(verl_config(fault_proxy.url, reference_source=source), tokenizer)
    out = mgr(validation_batch(ref_groups, tokenizer.pad_token_id), return_dict=True)
    info = out["reward_extra_info"]
    scores, refs = direct_scores(fault_proxy.url, ref_groups, tokenizer)
    ref_per_row = np.repeat(refs, [len(g.response_ids) for g in ref_groups])
    assert np.allclose(info["rm_score"], scores, atol=1e-5)
    assert info["win"] == [float(s > r) for s, r in zip(scores, ref_per_row)]
    assert info["win_and"] == [float(s >= r) for s, r in zip(scores, ref_per_row)]
    assert np.allclose(info["ref_margin"], np.array(scores) - ref_per_row, atol=1e-5)
    assert len(out["reward_tensor"]) == sum(len(g.response_ids) for g in ref_groups)  # references are not samples
    assert mgr.rm.references.scored == len(ref_groups)  # one reference per prompt


def test_response_identical_to_reference_ties(load_manager, rm_server, verl_config, tokenizer, ref_groups):
    mgr = load_manager(verl_config(rm_server.url), tokenizer)
    info = mgr(validation_batch(ref_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    assert info["win_and"][1] == 1.0 and info["win"][1] == 0.0
    assert info["ref_margin"][1] == 0.0


def test_no_win_metrics_outside_validation(load_manager, rm_server, verl_config, tokenizer, ref_groups):
    """Outside validation (``pairwise=auto``) no reference is scored and the win keys are None (present: verl builds
    a step's columns from its first sample, and validation samples may be in it); ``never``: no win keys."""
    mgr = load_manager(verl_config(rm_server.url), tokenizer)
    info = mgr(build_batch(ref_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    assert set(info["win"]) == {None} and mgr.rm.references.scored == 0
    never = load_manager(verl_config(rm_server.url, pairwise="never"), tokenizer)
    assert "win" not in never(build_batch(ref_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    forced = load_manager(verl_config(rm_server.url, pairwise="always"), tokenizer)
    assert "win" in forced(build_batch(ref_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]


def test_missing_reference_is_a_clear_error(load_manager, rm_server, verl_config, tokenizer, ref_groups):
    """``missing_reference=raise`` (the default) names the sample (its uid) and the source; only the second
    prompt lacks its reference here, so the uid named must be that prompt's."""
    g = ref_groups[1]
    groups = [ref_groups[0], Group(g.prompt_ids, g.response_ids, g.ground_truth, extra_info={}), ref_groups[2]]
    data = validation_batch(groups, tokenizer.pad_token_id)
    uids = list(dict.fromkeys(data.non_tensor_batch["uid"]))
    mgr = load_manager(verl_config(rm_server.url, reference_source="extra_info:answer"), tokenizer)
    with pytest.raises(MissingReferenceError,
                       match=rf"sample uid={uids[1]} has no reference answer in reference_source='extra_info:answer'"):
        mgr(data)


def test_missing_reference_can_be_skipped_and_counted(load_manager, rm_server, verl_config, tokenizer, ref_groups):
    groups = [ref_groups[0], Group(ref_groups[1].prompt_ids, ref_groups[1].response_ids, ground_truth="")]
    mgr = load_manager(verl_config(rm_server.url, missing_reference="skip"), tokenizer)
    info = mgr(validation_batch(groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    assert info["win"][4:] == [None, None] and None not in info["win"][:4]
    assert mgr.rm_scorer.references_missing == 2
