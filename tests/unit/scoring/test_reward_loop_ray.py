"""verl's ``RewardLoopManager`` with two real Ray reward-loop workers (CPU): the in-process tests (no server; those on the real server: tests/integration/scoring/test_reward_loop_ray.py)."""

from __future__ import annotations



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
