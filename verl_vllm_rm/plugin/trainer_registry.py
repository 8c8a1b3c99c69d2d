"""The package's trainer modes as verl's trainer registry holds them: one named class each, and the one function
that registers them (after checking every verl member they stand on, :mod:`~verl_vllm_rm.plugin.verl_seams`).

Each class is one of verl's v1 trainers with the reward metrics (:class:`~verl_vllm_rm.plugin.trainer_modes.
RewardMetrics`), and, for ``vllm_rm_online[_<mode>]``, online RM training with its timing
(:mod:`~verl_vllm_rm.plugin.online_mode`). Importing this module registers them; :mod:`~verl_vllm_rm.plugin.register`
imports it once verl's trainer registry is imported.
"""

from __future__ import annotations

from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSeparateAsync, PPOTrainerSync, register_trainer

from verl_vllm_rm.plugin.online_mode import OnlineRewardModelTraining, RMStepAfterStepEnd, RMStepInStep
from verl_vllm_rm.plugin.trainer_modes import RewardMetrics
from verl_vllm_rm.plugin.verl_seams import check_verl_seams, warn_old_trainer_mode_module


class RewardMetricsPPOTrainerSync(RewardMetrics, PPOTrainerSync):
    """verl's sync v1 trainer; each step also logs the reward metrics and alarms."""

    base_mode = "sync"


class RewardMetricsPPOTrainerColocateAsync(RewardMetrics, PPOTrainerColocateAsync):
    """verl's colocate_async v1 trainer; each step also logs the reward metrics and alarms."""

    base_mode = "colocate_async"


class RewardMetricsPPOTrainerSeparateAsync(RewardMetrics, PPOTrainerSeparateAsync):
    """verl's separate_async v1 trainer; each step also logs the reward metrics and alarms."""

    base_mode = "separate_async"


class OnlineRewardModelTrainer(RMStepInStep, OnlineRewardModelTraining, RewardMetricsPPOTrainerSync):
    """verl's sync v1 trainer with the reward metrics and one RM step (and publish) per PPO step."""


class OnlineRewardModelTrainerColocateAsync(RMStepAfterStepEnd, OnlineRewardModelTraining,
                                            RewardMetricsPPOTrainerColocateAsync):
    """verl's colocate_async v1 trainer with the reward metrics and one RM step (and publish) per PPO step."""


class OnlineRewardModelTrainerSeparateAsync(RMStepAfterStepEnd, OnlineRewardModelTraining,
                                            RewardMetricsPPOTrainerSeparateAsync):
    """verl's separate_async v1 trainer with the reward metrics and one RM step (and publish) per PPO step."""


#: ``trainer.v1.trainer_mode`` -> its class (``base_mode``: the verl mode it builds on)
TRAINER_MODES: dict[str, type[RewardMetrics]] = {
    "vllm_rm": RewardMetricsPPOTrainerSync,
    "vllm_rm_colocate_async": RewardMetricsPPOTrainerColocateAsync,
    "vllm_rm_separate_async": RewardMetricsPPOTrainerSeparateAsync,
    "vllm_rm_online": OnlineRewardModelTrainer,
    "vllm_rm_online_colocate_async": OnlineRewardModelTrainerColocateAsync,
    "vllm_rm_online_separate_async": OnlineRewardModelTrainerSeparateAsync,
}


def register_trainer_modes() -> None:
    """Check verl's seams (a missing or changed one stops the run here, at start-up), then register every trainer
    mode with verl's ``register_trainer`` (again with the same class is a no-op for verl)."""
    check_verl_seams()
    warn_old_trainer_mode_module()
    for name, cls in TRAINER_MODES.items():
        register_trainer(name)(cls)


register_trainer_modes()
