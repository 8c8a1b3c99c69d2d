"""Trainer mode ``vllm_rm`` (``scoring/trainer_mode.py``) with verl's own pieces, around a PPO step.

The class is built as main_ppo's task runner builds it, in a Ray worker that has only the package's
``verl.plugins`` entry point (no ``VERL_USE_EXTERNAL_MODULES``): the one override is all a stock run needs.
A step's rewards are read from a real TransferQueue written as verl's agent loop writes it. The metrics of
real main_ppo steps: ``tests/dev/test_tiny_ppo.py::test_reward_metrics_are_in_verls_logger_every_step_and_match_the_dump``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from tq_helpers import put_trajectories

from verl_vllm_rm.options import ConfigError

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "grpo_math_rm_weighted.sh"
pytestmark = pytest.mark.ray


def test_stock_verl_finds_trainer_mode_vllm_rm_and_it_behaves_as_sync(ray_cluster, compose_config):
    import ray

    run_env = dict(os.environ, VERL_VLLM_RM_DRY_RUN="1", RM_PATH="/models/rm")
    overrides = subprocess.run(["bash", str(RECIPE)], env=run_env, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    assert "trainer.v1.trainer_mode=vllm_rm" in overrides
    config = compose_config(overrides)

    @ray.remote(runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": ""}})
    def build(config):
        import verl  # noqa: F401  (loads the verl.plugins entry points)
        from verl.trainer.ppo.v1 import get_trainer_cls

        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
        return type(trainer).__name__, type(trainer.replay_buffer).__name__, trainer.trainer_mode

    assert ray.get(build.remote(config)) == ("RewardMetricsTrainer", "ReplayBuffer", "sync")


def manager_info(score: float, valid: float = 1.0) -> dict:
    return {"score": score, "rm_score": score, "rm_valid": valid, "rm_prompt_tokens_dropped": 0.0,
            "rm_tokens": 10.0, "rm_latency_ms": 5.0, "rm_weight_version": 0.0, "win": None}


@pytest.fixture(scope="module")
def vllm_rm_step(queue):
    """Two prompts x 2 responses with vllm_rm's reward_extra_info, padded by verl to 8 rows."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    groups = {"p": [([1, 2, 3], [4, 5], 1.0), ([1, 2, 3], [6, 7, 8, 9], 2.0)],
              "q": [([1, 9], [4], -1.0), ([1, 9], [5, 5, 5], 0.0)]}
    infos = {"p": [manager_info(1.0), manager_info(2.0)], "q": [manager_info(-1.0), manager_info(0.0, valid=0.0)]}
    batch = upsample_batch_to_divisible_size(put_trajectories(queue, groups, infos), 8, 0)
    assert len(batch) == 8
    return batch


def test_a_steps_rewards_are_read_without_the_padding_rows(vllm_rm_step):
    from verl_vllm_rm.scoring.trainer_mode import dump_columns, read_step_rewards

    keys, rewards = read_step_rewards(vllm_rm_step)
    assert keys == ["p_0_0", "p_1_0", "q_0_0", "q_1_0"]
    assert rewards.groups.tolist() == ["p", "p", "q", "q"]
    assert rewards.response_length.tolist() == [2, 4, 1, 3]
    assert rewards.columns["rm_valid"].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert "win" not in rewards.columns  # None in every row (no reference): nothing to report
    # verl's dump lists rows in its own order, padding rows included: those get None
    columns = dump_columns(["q_1_0", "p_0_0", "padding-key"], keys, rewards)
    assert columns["score"] == [0.0, 1.0, None] and columns["group"] == ["q", "p", None]
    assert columns["response_length"] == [3.0, 2.0, None] and columns["rm_valid"] == [0.0, 1.0, None]


def test_a_run_without_vllm_rm_is_named(queue):
    from verl_vllm_rm.scoring.trainer_mode import read_step_rewards

    batch = put_trajectories(queue, {"r": [([1], [2], 1.0)]}, {"r": [{"acc": 1.0}]})
    with pytest.raises(ConfigError, match="reward.reward_manager.name=vllm_rm"):
        read_step_rewards(batch)
