"""Process rewards: a server in step mode (``--step-tag-id``), per-step scores aggregated to a scalar or placed
on the step tags of the reward tensor; expected values from transformers' head at each step tag."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch

from verl_vllm_rm.dev.grpo_batch import Group, build_batch, row_token_ids
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.dev.tiny_rm import STEP
from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.parity.reference import sequence_scores, step_scores
from verl_vllm_rm.scoring.reward_model import StepRewardError

pytestmark = pytest.mark.server
VERIFIER = "from verl.utils.reward_score import default_compute_score as compute_score\n"


@pytest.fixture()
def batch_path(tmp_path) -> list[str]:
    """verl's batch reward path, which places token-level rewards from the manager's reward tensor under any
    trainer; verl then needs a custom reward function file (here: its own default verifier)."""
    verifier = tmp_path / "verifier.py"
    verifier.write_text(VERIFIER)
    return ["reward.reward_model.enable=True", "reward.reward_model.enable_resource_pool=False",
            f"reward.custom_reward_function.path={verifier}"]


@pytest.fixture(scope="module")
def step_id(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids(STEP)


@pytest.fixture(scope="module")
def step_server(tiny_rm, step_id, server_args):
    with running_server(tiny_rm, [*server_args, "--step-tag-id", str(step_id)]) as server:
        yield server


@pytest.fixture(scope="module")
def step_groups(tokenizer):
    """Two prompts (one holding a step tag itself) x three responses with 1-3 steps."""
    groups = []
    for a, b, prompt_tail in [(3, 4, ""), (12, 30, f" {STEP} show your steps")]:
        prompt = tokenizer(f"What is {a} + {b}?{prompt_tail}").input_ids
        responses = [tokenizer(text).input_ids for text in (
            f" add {a} and {b} {STEP} The answer is {a + b}. #### {a + b} {STEP}",
            f" The answer is {a * b}. #### {a * b} {STEP}",
            f" {a} plus {b} {STEP} carry {STEP} The answer is {a + b + 1}. #### {a + b + 1} {STEP}",
        )]
        groups.append(Group(prompt, responses, ground_truth=str(a + b), data_source="openai/gsm8k"))
    return groups


def expected_steps(hf_model, groups, step_id) -> list[list[float]]:
    """Transformers' score at each step tag of each response (the prompt's own tags left out)."""
    out = []
    for g in groups:
        in_prompt = g.prompt_ids.count(step_id)
        for r in g.response_ids:
            out.append(step_scores(hf_model, [row_token_ids(g, r)], step_id)[0][in_prompt:])
    return out


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@pytest.mark.parametrize(("method", "aggregate"), [
    ("min", min), ("last", lambda s: s[-1]), ("mean", lambda s: sum(s) / len(s)),
    ("prod", lambda s: math.prod(sigmoid(v) for v in s)),
])
def test_scalar_step_rewards_equal_transformers_steps(load_manager, step_server, verl_config, tokenizer, hf_model,
                                                      step_groups, step_id, method, aggregate):
    mgr = load_manager(verl_config(step_server.url, step_reward=method), tokenizer)
    out = mgr(build_batch(step_groups, tokenizer.pad_token_id), return_dict=True)
    want = [aggregate(s) for s in expected_steps(hf_model, step_groups, step_id)]
    assert np.allclose(out["reward_extra_info"]["rm_score"], want, atol=1e-4)
    tensor = out["reward_tensor"]
    assert np.allclose(tensor.sum(1).numpy(), want, atol=1e-4) and torch.count_nonzero(tensor) == len(want)


TOKEN_LEVEL = "+reward.reward_kwargs.rewards={components:[rubric,verifiable],weights:{rubric:0.5,verifiable:1.0}}"


def expected_token_rewards(hf_model, groups, step_id) -> list[torch.Tensor]:
    """rubric 0.5 + verifiable 1.0: each step's 0.5 x transformers' score on its tag, the verifier's 0/1 (a+b
    right, a*b and a+b+1 wrong) at the last token; one tensor per response, as long as it."""
    out = []
    responses = [r for g in groups for r in g.response_ids]
    for response, steps, correct in zip(responses, expected_steps(hf_model, groups, step_id), [1.0, 0.0, 0.0] * 2):
        want = torch.zeros(len(response))
        want[[p for p, t in enumerate(response) if t == step_id]] = 0.5 * torch.tensor(steps)
        want[-1] += correct
        out.append(want)
    return out


def test_token_level_step_rewards_sit_on_the_step_tags(load_manager, step_server, verl_config, tokenizer, hf_model,
                                                       step_groups, step_id, batch_path):
    mgr = load_manager(verl_config(step_server.url, TOKEN_LEVEL, *batch_path, step_reward="token"), tokenizer)
    out = mgr(build_batch(step_groups, tokenizer.pad_token_id), return_dict=True)
    tensor = out["reward_tensor"]
    for i, want in enumerate(expected_token_rewards(hf_model, step_groups, step_id)):
        assert torch.allclose(tensor[i, :len(want)], want, atol=1e-4) and not tensor[i, len(want):].any(), i
    info = out["reward_extra_info"]
    steps = expected_steps(hf_model, step_groups, step_id)
    assert np.allclose(info["rm_score"], [sum(s) for s in steps], atol=1e-4)
    assert np.allclose(info["score"], tensor.sum(1).numpy(), atol=1e-4)
    assert "token_rewards" not in info  # the tensor carries them


def test_in_verls_agent_loop_a_training_row_carries_its_token_rewards(load_manager, step_server, verl_config,
                                                                      tokenizer, hf_model, step_groups, step_id):
    """Under the package's trainer mode, ``run_single`` (verl's agent loop) returns the total as the scalar verl
    keeps, and the per-token rewards in ``token_rewards`` for the trainer mode to write into ``rm_scores`` (the
    write itself: tests/integration/dev/test_tiny_ppo_two_rms.py's main_ppo run); a validation row's reward is its sum alone."""
    mgr = load_manager(verl_config(step_server.url, TOKEN_LEVEL, "trainer.v1.trainer_mode=vllm_rm",
                                   step_reward="token", pairwise="never"), tokenizer)
    data = build_batch(step_groups, tokenizer.pad_token_id)

    async def each_row(validate: bool) -> list[dict]:
        rows = [data[i:i + 1] for i in range(len(data))]
        for row in rows:
            row.meta_info["validate"] = validate
        return await asyncio.gather(*(mgr.run_single(row) for row in rows))

    wants = expected_token_rewards(hf_model, step_groups, step_id)
    for result, want in zip(mgr.loop.run_until_complete(each_row(False)), wants):
        tokens = result["reward_extra_info"]["token_rewards"]
        assert len(tokens) == len(want) and np.allclose(tokens, want.numpy(), atol=1e-4)
        assert result["reward_score"] == pytest.approx(float(want.sum()), abs=1e-4)
        assert result["reward_score"] == result["reward_extra_info"]["score"]
    for result, want in zip(mgr.loop.run_until_complete(each_row(True)), wants):
        assert result["reward_extra_info"]["token_rewards"] is None
        assert result["reward_score"] == pytest.approx(float(want.sum()), abs=1e-4)


@pytest.mark.parametrize(("overrides", "trainer"), [
    ((), "trainer.v1.trainer_mode=sync"), (("trainer.use_v1=False",), "the legacy trainer")])
def test_token_level_is_refused_under_a_trainer_that_keeps_only_the_scalar(load_manager, step_server, verl_config,
                                                                           tokenizer, overrides, trainer):
    with pytest.raises(ConfigError) as refused:
        load_manager(verl_config(step_server.url, *overrides, step_reward="token"), tokenizer)
    assert str(refused.value) == (
        f"reward model(s) ['rm'] have step_reward=token, and this run's trainer ({trainer}) keeps only the scalar "
        "verl's agent loop places at the last token, so the step rewards would be dropped: select this package's "
        "trainer mode, trainer.v1.trainer_mode=vllm_rm (or vllm_rm_colocate_async, vllm_rm_separate_async; "
        "trainer.use_v1=True), which places them, or use a scalar step_reward (min, last, mean, prod)")


def test_a_response_without_steps_is_never_a_number(load_manager, step_server, verl_config, tokenizer, step_groups):
    no_steps = [Group(step_groups[0].prompt_ids, [tokenizer(" The answer is 7. #### 7").input_ids] * 2,
                      ground_truth="7", data_source="openai/gsm8k")]
    mgr = load_manager(verl_config(step_server.url, step_reward="min"), tokenizer)
    with pytest.raises(StepRewardError, match="has no step tag.*failure_policy=mask"):
        mgr(build_batch(no_steps, tokenizer.pad_token_id))
    masked = load_manager(verl_config(step_server.url, step_reward="min", failure_policy="mask"), tokenizer)
    info = masked(build_batch(no_steps, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    assert info["rm_valid"] == [0.0, 0.0] and masked.failed == 2


def test_step_reward_needs_a_server_in_step_mode(load_manager, rm_server, verl_config, tokenizer, step_groups):
    mgr = load_manager(verl_config(rm_server.url, step_reward="last"), tokenizer)
    with pytest.raises(StepRewardError, match="not in step mode: start it with --step-tag-id"):
        mgr(build_batch(step_groups, tokenizer.pad_token_id))


def test_step_mode_server_without_step_reward_scores_the_last_token(load_manager, step_server, verl_config, tokenizer,
                                                                    hf_model, step_groups):
    mgr = load_manager(verl_config(step_server.url), tokenizer)
    info = mgr(build_batch(step_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    rows = [row_token_ids(g, r) for g in step_groups for r in g.response_ids]
    assert np.allclose(info["rm_score"], sequence_scores(hf_model, rows), atol=1e-4)
