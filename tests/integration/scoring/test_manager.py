"""The ``vllm_rm`` manager loaded through verl's own ``load_reward_manager`` (real server, real verl)."""

import asyncio
import json

import numpy as np
import pytest
import torch

from verl_vllm_rm.client.reward_client import RewardRequestError
from verl_vllm_rm.dev.grpo_batch import build_batch, last_token_rewards, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.client.length import OverlongInputError


def expected_scores(hf_model, groups):
    return sequence_scores(hf_model, [row_token_ids(g, r) for g in groups for r in g.response_ids])


def rows_in_order(groups):
    return [(g, r) for g in groups for r in g.response_ids]


def test_rewards_equal_transformers_at_last_valid_token(load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    mgr = load_manager(verl_config(rm_server.url), tokenizer)
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    out = mgr(data, return_dict=True)
    tensor = out["reward_tensor"]
    assert tensor.shape == data.batch["responses"].shape
    picked = last_token_rewards(tensor, data)
    expected = torch.tensor(expected_scores(hf_model, grpo_groups))
    assert torch.allclose(picked, expected, atol=1e-4)
    assert torch.count_nonzero(tensor) == len(data)  # nothing but the last valid token is set
    info = out["reward_extra_info"]
    assert info["rm_valid"] == [1.0] * len(data)
    # what the step metrics read: tokens sent, the server's weight version, the time to each score
    assert info["rm_tokens"] == [float(len(row_token_ids(g, r))) for g, r in rows_in_order(grpo_groups)]
    assert info["rm_weight_version"] == [0.0] * len(data)
    assert all(0.0 < ms < 60_000 for ms in info["rm_latency_ms"])


def test_run_single_matches_and_groups_into_one_request(load_manager, fault_proxy, verl_config, tokenizer, hf_model, grpo_groups):
    mgr = load_manager(verl_config(fault_proxy.url), tokenizer)
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    perm = np.random.default_rng(0).permutation(len(data))  # members of a group arrive interleaved
    shuffled = data[perm]

    async def score_all():
        import asyncio

        return await asyncio.gather(*(mgr.run_single(shuffled[i : i + 1]) for i in range(len(shuffled))))

    outs = mgr.loop.run_until_complete(score_all())
    expected = np.array(expected_scores(hf_model, grpo_groups))[perm]
    assert np.allclose([o["reward_score"] for o in outs], expected, atol=1e-4)
    score_requests = [r for r in fault_proxy.requests if r["path"] == "/score"]
    assert len(score_requests) == 1 and mgr.rm.batcher.requests_sent == 1
    sent = json.loads(score_requests[0]["body"])["input"]
    uids = [shuffled.non_tensor_batch["uid"][i] for i in range(len(shuffled))]
    sent_group_of = {tuple(row_token_ids(g, r)): id(g) for g, r in rows_in_order(grpo_groups)}
    order = [sent_group_of[tuple(ids)] for ids in sent]
    assert order == sorted(order, key=order.index), "members of a group must be sent adjacently"
    assert len(set(uids)) == len(grpo_groups)


@pytest.mark.timeout(120)
def test_the_batch_call_sends_its_samples_at_once_not_after_the_coalescing_window(
        load_manager, fault_proxy, verl_config, tokenizer, hf_model, grpo_groups):
    """The batch call knows when every sample is queued and sends them then: with an hour-long coalescing window
    it still returns (without the flush it would wait out the window, and this test its timeout)."""
    mgr = load_manager(verl_config(fault_proxy.url, coalesce_ms=3_600_000, max_length=512), tokenizer)
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    assert len(data) < mgr.rm.options.client.max_batch_seqs  # the batch alone never fills a request
    picked = last_token_rewards(mgr(data), data)
    assert torch.allclose(picked, torch.tensor(expected_scores(hf_model, grpo_groups)), atol=1e-4)
    assert [r["path"] for r in fault_proxy.requests] == ["/score"] and mgr.rm.batcher.requests_sent == 1


@pytest.mark.timeout(120)
def test_rows_verl_hands_over_together_are_sent_at_once_and_a_lone_row_waits_for_the_window(
        load_manager, fault_proxy, verl_config, tokenizer, hf_model, grpo_groups):
    """verl's reward loop hands every row of a batch to ``run_single`` in one event-loop iteration: the row queue
    gathers them, and the set is sent then, not after the coalescing window (an hour here: without the flush this
    test would time out). A row that arrives alone still waits for the window, so two lone rows of consecutive
    iterations go out in one request."""
    import asyncio

    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    together = load_manager(verl_config(fault_proxy.url, coalesce_ms=3_600_000, max_length=512), tokenizer)

    async def all_rows():
        return await asyncio.gather(*(together.run_single(data[i:i + 1]) for i in range(len(data))))

    outs = together.loop.run_until_complete(all_rows())
    assert np.allclose([o["reward_score"] for o in outs], expected_scores(hf_model, grpo_groups), atol=1e-4)
    assert together.rm.batcher.requests_sent == 1
    alone = load_manager(verl_config(fault_proxy.url, coalesce_ms=500, max_length=512), tokenizer)

    async def two_lone_rows():
        first = asyncio.ensure_future(alone.run_single(data[0:1]))
        for _ in range(3):  # the first row's set is drained and queued in the batcher before the second arrives
            await asyncio.sleep(0)
        return await asyncio.gather(first, alone.run_single(data[1:2]))

    outs = alone.loop.run_until_complete(two_lone_rows())
    assert np.allclose([o["reward_score"] for o in outs], expected_scores(hf_model, grpo_groups)[:2], atol=1e-4)
    assert alone.rm.batcher.requests_sent == 1


@pytest.mark.parametrize("mode", ["add", "multiply", "weighted"])
def test_combination_with_verifiable_reward(load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups, mode):
    mgr = load_manager(verl_config(rm_server.url, combine=mode, alpha=0.25), tokenizer)
    out = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)
    info = out["reward_extra_info"]
    rm = np.array(expected_scores(hf_model, grpo_groups))
    correct = np.array([float(r_idx in (0, 3)) for g in grpo_groups for r_idx in range(len(g.response_ids))])
    assert np.array_equal(info["verifiable_score"], correct)  # verl's own gsm8k scorer
    want = {"add": rm + correct, "multiply": rm * correct, "weighted": 0.25 * rm + 0.75 * correct}[mode]
    assert np.allclose(info["score"], want, atol=1e-4)
    assert np.allclose(info["rm_score"], rm, atol=1e-4)


def test_overlong_inputs_drop_prompt_tokens_from_the_left(load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    mgr = load_manager(verl_config(rm_server.url, max_length=42), tokenizer)
    out = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)
    rows = [row_token_ids(g, r)[-42:] for g, r in rows_in_order(grpo_groups)]
    dropped = [max(0, len(row_token_ids(g, r)) - 42) for g, r in rows_in_order(grpo_groups)]
    assert 0 < sum(dropped) and min(dropped) == 0  # some rows fit, some are cut
    assert out["reward_extra_info"]["rm_prompt_tokens_dropped"] == [float(d) for d in dropped]
    picked = out["reward_tensor"].sum(dim=1)
    assert torch.allclose(picked, torch.tensor(sequence_scores(hf_model, rows)), atol=1e-4)


def test_overlong_error_policy(load_manager, rm_server, verl_config, tokenizer, grpo_groups):
    mgr = load_manager(verl_config(rm_server.url, max_length=32, overlong_policy="error"), tokenizer)
    with pytest.raises(OverlongInputError, match="exceed the reward model's max length 32"):
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))


def test_an_input_that_cannot_be_built_is_masked_under_failure_policy_mask(
        load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    """An RM input that cannot be built (here: longer than ``max_length`` with ``overlong_policy=error``) is that
    RM's failure for the sample: under ``failure_policy=mask`` the sample is masked, never a number, and the others
    are scored (a masked sample's reward is 0.0 with rm_valid 0.0, as for a failed request)."""
    lengths = [len(row_token_ids(g, r)) for g, r in rows_in_order(grpo_groups)]
    limit = sorted(lengths)[len(lengths) // 2]
    mgr = load_manager(verl_config(rm_server.url, max_length=limit, overlong_policy="error", failure_policy="mask"),
                       tokenizer)
    info = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    for n, valid, score, want in zip(lengths, info["rm_valid"], info["rm_score"], expected_scores(hf_model,
                                                                                                   grpo_groups)):
        assert (valid, score) == ((0.0, 0.0) if n > limit else (1.0, pytest.approx(want, abs=1e-4))), (n, limit)
    assert mgr.rm.failed == sum(n > limit for n in lengths) > 0


def test_a_sample_that_cannot_start_stops_the_batch_and_leaves_nothing_running(
        load_manager, rm_server, verl_config, tokenizer, grpo_groups):
    """The batch call starts its samples one by one (requests queued, verl's compute_score running); an overlong
    sample further down raises, and the samples started before it are cancelled, not left running."""
    lengths = [len(row_token_ids(g, r)) for g, r in rows_in_order(grpo_groups)]
    limit = max(lengths[:2])
    assert any(n > limit for n in lengths[2:])  # the first two rows start, a later one cannot
    mgr = load_manager(verl_config(rm_server.url, max_length=limit, overlong_policy="error", combine="add"), tokenizer)
    with pytest.raises(OverlongInputError, match=f"exceed the reward model's max length {limit}"):
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))
    assert [t for t in asyncio.all_tasks(mgr.loop) if not t.done()] == []
    assert mgr.rm.batcher.in_flight == 0


def test_per_row_calls_scored_together_still_fail_alone(
        load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    """verl's per-row calls of one loop iteration are scored as one set (RowQueue): a row that cannot start (an
    overlong input) gets its own error, and every other row its reward, as if each had been scored alone."""
    lengths = [len(row_token_ids(g, r)) for g, r in rows_in_order(grpo_groups)]
    limit = sorted(lengths)[len(lengths) // 2]
    mgr = load_manager(verl_config(rm_server.url, max_length=limit, overlong_policy="error"), tokenizer)
    data = build_batch(grpo_groups, tokenizer.pad_token_id)

    async def score_rows():
        return await asyncio.gather(*(mgr.run_single(data[i : i + 1]) for i in range(len(data))),
                                    return_exceptions=True)

    outs = mgr.loop.run_until_complete(score_rows())
    expected = expected_scores(hf_model, grpo_groups)
    for n, out, score in zip(lengths, outs, expected):
        if n > limit:
            assert isinstance(out, OverlongInputError) and f"max length {limit}" in str(out)
        else:
            assert out["reward_score"] == pytest.approx(score, abs=1e-4)
    assert 0 < sum(n > limit for n in lengths) < len(lengths)
    assert mgr.rm.batcher.requests_sent == 1  # the rows that started went in one request
    assert [t for t in asyncio.all_tasks(mgr.loop) if not t.done()] == []


GRPO_SUMS = [(3, 4), (12, 30), (7, 8), (100, 23)]  # how conftest's grpo_groups are built


GRPO_THINK = [1, 3, 0, 6]


def test_chat_template_input(load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups, tiny_rm):
    """The RM scores the chat rendered with the RM tokenizer's template, written out here literally
    (ChatML, as the tiny RM's template renders it), not produced by ``chat_template_ids``, the
    function under test: a wrong role, a missing turn marker or a prompt-only render changes the ids
    and the scores."""
    mgr = load_manager(verl_config(rm_server.url, input_format="chat_template", rm_tokenizer_path=tiny_rm),
                              tokenizer)
    out = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)
    rendered = []
    for a, b in GRPO_SUMS:
        for k, v in zip(GRPO_THINK, [a + b, a + b + 1, a * b, a + b]):
            response = f" <think>{'add ' * k}</think> The answer is {v}. #### {v}"
            rendered.append(f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n"
                            f"<|im_start|>assistant\n{response}<|im_end|>\n")
    assert [tokenizer.decode(r) for _, r in rows_in_order(grpo_groups)] == [
        t.split("assistant\n", 1)[1].removesuffix("<|im_end|>\n") for t in rendered]  # the fixture's responses
    rows = [tokenizer(text, add_special_tokens=False).input_ids for text in rendered]
    assert torch.allclose(out["reward_tensor"].sum(1), torch.tensor(sequence_scores(hf_model, rows)), atol=1e-4)
    plain = torch.tensor(expected_scores(hf_model, grpo_groups))  # the token_ids input differs: the test can tell
    assert (out["reward_tensor"].sum(1) - plain).abs().max() > 1e-2


def test_chat_template_without_the_raw_chat_names_the_setting(load_manager, rm_server, verl_config, tokenizer, grpo_groups, tiny_rm):
    """``input_format=chat_template`` needs verl's ``data.return_raw_chat=True``: without it the batch has no
    ``raw_prompt`` column, and the step fails saying which setting to change (no request is scored from
    the policy's ids instead)."""
    from verl_vllm_rm.dev.grpo_batch import Group

    mgr = load_manager(verl_config(rm_server.url, input_format="chat_template", rm_tokenizer_path=tiny_rm),
                              tokenizer)
    no_chat = [Group(g.prompt_ids, g.response_ids, g.ground_truth, g.data_source) for g in grpo_groups]
    data = build_batch(no_chat, tokenizer.pad_token_id)
    assert "raw_prompt" not in data.non_tensor_batch  # what verl's dataset gives without return_raw_chat
    with pytest.raises(ValueError, match=r"input_format=chat_template needs the raw chat: set data\.return_raw_chat=True"):
        mgr(data)
    assert mgr.rm.batcher.requests_sent == 0


def test_model_name_is_checked_by_the_server(load_manager, fault_proxy, verl_config, tokenizer, hf_model, grpo_groups, tiny_rm):
    """``reward_kwargs.model`` goes out in every ``/score`` request: the served name scores, another name
    stops the step with the server's 404 naming it, sent once (a refusal is not retried)."""
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    served = load_manager(verl_config(fault_proxy.url, model=tiny_rm, max_length=512), tokenizer)
    picked = last_token_rewards(served(data), data)
    assert torch.allclose(picked, torch.tensor(expected_scores(hf_model, grpo_groups)), atol=1e-4)
    assert {json.loads(r["body"])["model"] for r in fault_proxy.requests if r["path"] == "/score"} == {tiny_rm}

    fault_proxy.requests.clear()
    wrong = load_manager(verl_config(fault_proxy.url, model="other-rm", max_length=512, max_retries=3), tokenizer)
    with pytest.raises(RewardRequestError, match=r"HTTP 404: model 'other-rm' is not served here"):
        wrong(data)
    assert len(fault_proxy.requests) == 1  # the whole batch is one request, refused once


def test_num_examine_prints_components(load_manager, rm_server, verl_config, tokenizer, grpo_groups, capsys):
    mgr = load_manager(verl_config(rm_server.url, num_examine=2, combine="add"), tokenizer)
    mgr(build_batch(grpo_groups, tokenizer.pad_token_id))
    printed = capsys.readouterr().out
    assert printed.count("[vllm_rm] data_source=openai/gsm8k") == 2
    for key in ("[prompt] What is", "[response]", "[rm_score]", "[verifiable_score]", "[score]"):
        assert key in printed
