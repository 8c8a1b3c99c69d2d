"""verl's ``RewardLoopManager`` with two real Ray reward-loop workers (CPU).

The workers are fresh processes: they find ``vllm_rm`` only through the
``verl.plugins`` entry point. Rows are shuffled so every prompt group is split
across both workers; the scores must still equal transformers'. verl's agent loop
calls the same workers for each trajectory (``AgentLoopWorker._compute_score``):
a trajectory of several outputs is scored on its last, and verl's batch assembly
(``compute_rm_score``) gets the same keys from every sample, verl's ``naive``
manager beside it as the control.
"""

import asyncio
import contextlib

import numpy as np
import pytest
import torch
from ray_helpers import start_local_ray
from tq_helpers import put_trajectories
from verl_assembly import agent_loop_output, agent_loop_worker

from verl_vllm_rm.dev.grpo_batch import build_batch, last_token_rewards, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    start_local_ray(num_cpus=4, ignore_reinit_error=True)
    yield
    ray.shutdown()


@contextlib.contextmanager
def reward_loop(config):
    """verl's ``RewardLoopManager`` on ``config``; its Ray workers killed after."""
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    manager = RewardLoopManager(config)
    try:
        yield manager
    finally:
        for worker in manager.reward_loop_workers:
            ray.kill(worker)


def test_verls_batch_assembly_gets_the_same_keys_from_math_dapo_and_gsm8k_rows_in_either_order(
        ray_cluster, rm_server, verl_config, compose_config, tiny_rm, tokenizer):
    """verl's ``compute_rm_score`` builds the step's columns from the first sample's keys: with naive (the control)
    math_dapo rows first raise ``KeyError``, gsm8k rows first lose ``pred``; with vllm_rm both orders give the same
    columns, ``acc`` and ``pred`` among them."""
    from verl_vllm_rm.dev.grpo_batch import Group, build_batch

    prompt = tokenizer("What is 3 + 4?").input_ids
    answers = {"math_dapo": ["Answer: 7", "Answer: 9"], "openai/gsm8k": ["#### 7", "#### 8"]}
    batches = [build_batch([Group(prompt, [tokenizer(a).input_ids for a in answers[s]], ground_truth="7",
                                  data_source=s) for s in order], tokenizer.pad_token_id)
               for order in (("math_dapo", "openai/gsm8k"), ("openai/gsm8k", "math_dapo"))]
    with reward_loop(verl_config(rm_server.url, "reward.num_workers=2", combine="add", num_examine=0)) as ours:
        keys = [ours.compute_rm_score(batch).meta_info["reward_extra_keys"] for batch in batches]
        acc = ours.compute_rm_score(batches[0]).non_tensor_batch["acc"].tolist()
    assert keys[0] == keys[1] and {"acc", "pred", "verifiable_score", "rm_score"} <= set(keys[0])
    assert acc == [True, False, 1.0, 0.0]
    naive = compose_config(["reward.reward_manager.name=naive", f"actor_rollout_ref.model.path={tiny_rm}",
                            "reward.num_workers=2"])
    with reward_loop(naive) as control:
        with pytest.raises(KeyError):
            control.compute_rm_score(batches[0])
        assert "pred" not in control.compute_rm_score(batches[1]).meta_info["reward_extra_keys"]


def test_dapo_reads_acc_where_verl_reads_it_from_math_dapo_and_gsm8k_groups(queue, verl_config, compose_config,
                                                                         dead_url, tiny_rm, tokenizer):
    """``algorithm.filter_groups.metric=acc`` at the place verl 0.9.1 reads it: the v1 replay buffer's
    ``_dapo_filtered_keys`` (trainer/ppo/v1/replay_buffer.py) reads each finished trajectory's
    ``extra_fields.reward_extra_info["acc"]`` from the real TransferQueue and filters the groups whose ``acc`` is
    uniform (a group without it raises ``RuntimeError``). vllm_rm's real results (a math_dapo group, right and
    wrong; a gsm8k group, right and wrong; a gsm8k group wrong twice) give the filter exactly naive's answer: only
    the uniform group.

    Why not in a main_ppo run: every run the tests make uses the tiny policy, which is right on about 1% of its
    gsm8k answers (3 of 281 in a measured separate_async run with math_dapo prompts) and never writes the "Answer:"
    verl's DAPO scorer wants; almost every group's ``acc`` is uniform, DAPO evicts it, and after 7 minutes the run
    had not sampled its first batch (2 mixed groups of 71). verl 0.9.1's v1 replay buffer ignores
    ``filter_groups.max_num_gen_batches`` (trainer_base.py), so nothing bounds such a run. The tiny_ppo run in
    tests/integration/dev/test_tiny_ppo.py has math_dapo and gsm8k prompts and filters on ``score`` instead."""
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from verl_vllm_rm.dev.grpo_batch import Group, build_batch
    from verl_vllm_rm.scoring.manager import VLLMRewardManager

    prompt = tokenizer("What is 3 + 4?").input_ids
    answers = [("math_dapo", ["Answer: 7", "Answer: 9"]), ("openai/gsm8k", ["#### 7", "#### 8"]),
               ("openai/gsm8k", ["#### 8", "#### 9"])]
    groups = [Group(prompt, [tokenizer(a).input_ids for a in texts], ground_truth="7", data_source=source)
              for source, texts in answers]
    data = build_batch(groups, tokenizer.pad_token_id)
    rows = [data[i: i + 1] for i in range(len(data))]
    no_rm = {"routes": [{"data_source": ["*"], "reward_models": []}], "rewards": {"components": ["verifiable"]},
             "num_examine": 0}
    ours = VLLMRewardManager(verl_config(dead_url, **no_rm), tokenizer)
    control = load_reward_manager(compose_config(["reward.reward_manager.name=naive",
                                                  f"actor_rollout_ref.model.path={tiny_rm}"]), tokenizer)

    def filtered(manager, tag: str) -> set[str]:
        async def score():
            return await asyncio.gather(*(manager.run_single(row) for row in rows))

        results = manager.loop.run_until_complete(score())
        uids = [f"{tag}{g}" for g in range(len(groups))]
        meta = put_trajectories(queue, {uid: [(prompt, [1], r["reward_score"]) for r in results[2 * g: 2 * g + 2]]
                                        for g, uid in enumerate(uids)},
                                {uid: [r["reward_extra_info"] for r in results[2 * g: 2 * g + 2]]
                                 for g, uid in enumerate(uids)})
        buffer = ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                              max_off_policy_strategy="drop", sampler_kwargs={}, refill_fn=lambda n: None,
                              filter_groups_metric="acc", train_batch_size=len(groups), gen_batch_size=1)
        # what _sync_metadata_from_transfer_queue finds once the agent loop tags the prompts finished
        buffer.finished_keys["train"] = set(uids)
        buffer.partitions["train"] = dict(zip(meta.keys, meta.tags))
        uids_filtered, _ = buffer._dapo_filtered_keys("train")
        return {uid[len(tag):] for uid in uids_filtered}

    try:
        assert filtered(ours, "vllmrm-") == filtered(control, "naive-") == {"2"}  # verl splits keys at "_"
    finally:
        ours.close()


@pytest.fixture(scope="module")
def two_workers(ray_cluster, rm_server, verl_config):
    """One ``RewardLoopManager`` of two workers on vllm_rm's defaults against the session's server, and its config
    (worker processes cost a verl import each: the tests that need no other options share them). Its tests close
    the module: verl names every manager's workers ``reward_loop_worker_<i>``, so no other manager can start while
    these live."""
    config = verl_config(rm_server.url, "reward.num_workers=2", num_examine=0)
    with reward_loop(config) as manager:
        yield manager, config


def test_two_workers_split_groups_same_scores(two_workers, tokenizer, hf_model, grpo_groups):
    manager = two_workers[0]
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    perm = np.array([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])  # each group on both workers
    data = data[perm]
    assert len(manager.reward_loop_workers) == 2
    out = manager.compute_rm_score(data)

    rows = [row_token_ids(g, r) for g in grpo_groups for r in g.response_ids]
    expected = torch.tensor(sequence_scores(hf_model, [rows[i] for i in perm]))
    rm_scores = out.batch["rm_scores"]
    assert torch.allclose(last_token_rewards(rm_scores, data), expected, atol=1e-4)
    assert torch.count_nonzero(rm_scores) == len(data)
    assert out.non_tensor_batch["rm_valid"].tolist() == [1.0] * len(data)
    assert {"score", "rm_score", "rm_valid"} <= set(out.meta_info["reward_extra_keys"])


def test_concurrent_trajectories_of_several_outputs_are_each_scored_on_their_own_last_output(
        two_workers, hf_model, grpo_groups):
    """verl's own ``AgentLoopWorker._compute_score`` (a real one, in this process, its reward calls going to the
    real Ray reward-loop workers) hands ``run_single`` one row per output and gives the reward to the last: four
    trajectories of three distinct outputs each, scored concurrently, each get the score of exactly their own last
    output (an RM score per distinct sequence: a crossed or first-row score would differ)."""
    manager, config = two_workers
    rows = [(g.prompt_ids, r) for g in grpo_groups for r in g.response_ids]
    # each output of another prompt and length: verl right-pads them, the mask does not split prompt from response
    trajectories = [[agent_loop_output(*rows[4 * ((t + k) % 4) + t]) for k in range(3)] for t in range(4)]
    worker = agent_loop_worker(config, manager.reward_loop_workers)

    async def score_all():
        await asyncio.gather(*(worker._compute_score(outputs, kwargs={
            "data_source": "openai/gsm8k", "uid": f"t{t}", "reward_model": {"ground_truth": "7"}})
            for t, outputs in enumerate(trajectories)))

    asyncio.run(score_all())
    last = [list(outputs[-1].prompt_ids) + list(outputs[-1].response_ids) for outputs in trajectories]
    expected = sequence_scores(hf_model, last)
    assert [outputs[-1].reward_score for outputs in trajectories] == pytest.approx(expected, abs=1e-4)
    assert len(set(np.round(expected, 4))) == len(expected)  # distinct: a crossed score would show
    assert all(o.reward_score is None for outputs in trajectories for o in outputs[:-1])
    assert all(outputs[-1].extra_fields["reward_extra_info"]["rm_valid"] == 1.0 for outputs in trajectories)
