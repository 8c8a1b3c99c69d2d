"""verl's ``RewardLoopManager`` with two real Ray reward-loop workers (CPU).

The workers are fresh processes: they find ``vllm_rm`` only through the
``verl.plugins`` entry point. Rows are shuffled so every prompt group is split
across both workers; the scores must still equal transformers'.
"""

import numpy as np
import pytest
import torch
from ray_helpers import start_local_ray

from verl_vllm_rm.dev.grpo_batch import build_batch, last_token_rewards, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    start_local_ray(num_cpus=4, ignore_reinit_error=True)
    yield
    ray.shutdown()


def test_two_workers_split_groups_same_scores(ray_cluster, rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    cfg = verl_config(rm_server.url, "reward.num_workers=2")
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    perm = np.array([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])  # each group on both workers
    data = data[perm]
    manager = RewardLoopManager(cfg)
    assert len(manager.reward_loop_workers) == 2
    out = manager.compute_rm_score(data)

    rows = [row_token_ids(g, r) for g in grpo_groups for r in g.response_ids]
    expected = torch.tensor(sequence_scores(hf_model, [rows[i] for i in perm]))
    rm_scores = out.batch["rm_scores"]
    assert torch.allclose(last_token_rewards(rm_scores, data), expected, atol=1e-4)
    assert torch.count_nonzero(rm_scores) == len(data)
    assert out.non_tensor_batch["rm_valid"].tolist() == [1.0] * len(data)
    assert {"score", "rm_score", "rm_valid"} <= set(out.meta_info["reward_extra_keys"])


def test_importlib_route_finds_the_manager(verl_config, tokenizer):
    from verl.trainer.ppo.reward import load_reward_manager

    from verl_vllm_rm.scoring.manager import VLLMRewardManager

    cfg = verl_config(
        "http://127.0.0.1:1",
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.name=VLLMRewardManager",
        "reward.reward_manager.module.path=pkg://verl_vllm_rm.scoring.manager",
    )
    assert type(load_reward_manager(cfg, tokenizer)) is VLLMRewardManager
