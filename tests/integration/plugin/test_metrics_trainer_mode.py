"""Trainer mode ``vllm_rm`` (``plugin/trainer_modes.py``) with verl's own pieces, around a PPO step.

The class is built as main_ppo's task runner builds it, in a Ray worker that has only the package's
``verl.plugins`` entry point (no ``VERL_USE_EXTERNAL_MODULES``): the one override is all a stock run needs.
A step's rewards are read from a real TransferQueue written as verl's agent loop writes it. The metrics of
real main_ppo steps: ``tests/integration/dev/test_tiny_ppo.py::test_reward_metrics_are_in_verls_logger_every_step_and_match_the_dump``.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from tq_helpers import put_trajectories

from verl_vllm_rm.options import ConfigError
from repo_paths import REPO

RECIPE = REPO / "recipes" / "grpo_math_rm_weighted.sh"
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def recipe_overrides() -> list[str]:
    run_env = dict(os.environ, VERL_VLLM_RM_DRY_RUN="1", RM_PATH="/models/rm")
    overrides = subprocess.run(["bash", str(RECIPE)], env=run_env, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    assert "trainer.v1.trainer_mode=vllm_rm" in overrides
    return overrides


# separate_async runs the rollout on GPUs of its own, synced over a real checkpoint engine, once per mini-batch
SEPARATE = ["trainer.v1.separate_async.parameter_sync_step=4", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]


@pytest.mark.parametrize(("mode", "extra", "built"), [
    ("vllm_rm", [], ("RewardMetricsPPOTrainerSync", "ReplayBuffer", "sync")),
    ("vllm_rm_colocate_async", [], ("RewardMetricsPPOTrainerColocateAsync", "ReplayBufferAsync", "colocate_async")),
    ("vllm_rm_separate_async", SEPARATE,
     ("RewardMetricsPPOTrainerSeparateAsync", "ReplayBufferAsync", "separate_async")),
])
def test_stock_verl_finds_the_trainer_mode_and_it_behaves_as_its_base(ray_cluster, compose_config, recipe_overrides,
                                                                      mode, extra, built):
    """Built as main_ppo's task runner builds it, from the recipe's config, in a worker with only the entry point:
    verl keys its replay buffer, refill and checkpoints off ``trainer_mode``, which stays the base mode's."""
    import ray

    config = compose_config([o if o != "trainer.v1.trainer_mode=vllm_rm" else f"trainer.v1.trainer_mode={mode}"
                             for o in recipe_overrides] + extra)

    @ray.remote(runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": ""}})
    def build(config):
        import verl  # noqa: F401  (loads the verl.plugins entry points)
        from verl.trainer.ppo.v1 import get_trainer_cls

        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
        return type(trainer).__name__, type(trainer.replay_buffer).__name__, trainer.trainer_mode

    assert ray.get(build.remote(config)) == built


def test_every_mode_of_verls_is_covered():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from verl_vllm_rm.plugin.trainer_modes import RewardMetrics
    from verl_vllm_rm.plugin.trainer_registry import TRAINER_MODES

    metrics_modes = {name: cls for name, cls in TRAINER_MODES.items() if "online" not in name}
    assert sorted(cls.base_mode for cls in metrics_modes.values()) == ["colocate_async", "separate_async", "sync"]
    for name, cls in metrics_modes.items():
        assert get_trainer_cls(name) is cls and name == "vllm_rm" + ("" if cls.base_mode == "sync" else
                                                                      f"_{cls.base_mode}")
        assert cls.__mro__[1:3] == (RewardMetrics, get_trainer_cls(cls.base_mode))


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
    from verl_vllm_rm.plugin.trainer_modes import STEP_FIELDS, dump_columns, read_step, step_rewards

    keys, data = read_step(vllm_rm_step, STEP_FIELDS)
    rewards = step_rewards(data)
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
    from verl_vllm_rm.plugin.trainer_modes import STEP_FIELDS, read_step, step_rewards

    batch = put_trajectories(queue, {"r": [([1], [2], 1.0)]}, {"r": [{"acc": 1.0}]})
    with pytest.raises(ConfigError, match="reward.reward_manager.name=vllm_rm"):
        step_rewards(read_step(batch, STEP_FIELDS)[1])


def test_token_rewards_are_written_into_rm_scores_where_they_fit(queue):
    """``step_reward=token`` in the agent loop: each trajectory's ``token_rewards`` replace the scalar verl's agent
    loop placed at its last token (here 10x the score), in TransferQueue; a list not as long as the trajectory's
    ``rm_scores`` (a multi-output agent loop's earlier output) leaves verl's scalar, and the share placed is the
    step's metric; a row without token rewards is left alone."""
    from verl_vllm_rm.plugin.token_placement import PLACED_METRIC, place_token_rewards, placed_rewards

    batch = put_trajectories(queue, {"t": [([1], [2, 3, 4], 0.7), ([1], [5, 6], 0.2)], "u": [([1], [7, 8], 0.5)]},
                             {"t": [{"token_rewards": [0.25, 0.0, 0.45]}, {"token_rewards": [0.5, 0.0, 1.5]}],
                              "u": [{"token_rewards": None}]})
    assert place_token_rewards(batch) == {PLACED_METRIC: 0.5}
    assert placed_rewards(batch.partition_id, batch.keys) == [
        pytest.approx([0.25, 0.0, 0.45]), pytest.approx([0.0, 2.0]), pytest.approx([0.0, 5.0])]
    untouched = put_trajectories(queue, {"v": [([1], [9], 0.5)]}, {"v": [{"rm_valid": 1.0}]})
    assert place_token_rewards(untouched) == {}
    assert placed_rewards(untouched.partition_id, untouched.keys) == [pytest.approx([5.0])]
