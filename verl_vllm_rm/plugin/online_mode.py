"""Online RM training inside a verl PPO/GRPO run (opt-in): trainer mode ``vllm_rm_online``.

After each PPO step this trainer reads the step's rollouts (``uid``, prompt and
response ids, reward) from verl's TransferQueue, in the same read as the reward
metrics of trainer mode ``vllm_rm``, builds best-vs-worst preference pairs per
prompt group, and runs one Bradley-Terry step on a separate Ray worker group
(:class:`~verl_vllm_rm.online.driver.OnlineRewardModel`), whose hook publishes the
new RM weights into the running reward server.

Enable it with one override (see ``recipes/grpo_math_online_rm.sh``)::

    python -m verl.trainer.main_ppo trainer.v1.trainer_mode=vllm_rm_online \\
        +online_rm.model_path=... [+online_rm.training_mode=lora ...]  (server_url: the reward manager's)

The package's ``verl.plugins`` entry point registers it in every process (no
environment variable). Needs verl's v1 trainer dependencies (``transfer_queue``,
installed by ``make setup``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Hashable

import numpy as np
from omegaconf import DictConfig, OmegaConf
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1 import register_trainer
from verl.utils.debug import marked_timer

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.protocol.defaults import DEFAULT_SERVER_URL
from verl_vllm_rm.plugin.trainer_modes import RewardMetricsTrainer, resumed_folder, reward_extra_info, step_folder
from verl_vllm_rm.rows import unpadded
from verl_vllm_rm.scoring.options import DEFAULT_RM_NAME, run_reward_models

# ``verl_vllm_rm.online.driver`` is imported where it is used: it starts Ray worker groups, which the many
# processes that register this trainer mode (every process that imports verl's trainer) never need.

if TYPE_CHECKING:
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.drift import DriftProbe
    from verl_vllm_rm.online.driver import OnlineRewardModel

logger = logging.getLogger(__name__)

TRAINER_MODE = "vllm_rm_online"
RM_CHECKPOINT_DIR = "online_rm"  # beside verl's actor/ and data.pt in each global_step_N folder
#: The reward verl writes for every trajectory (token-level, summed per sample); any other
#: ``reward_key`` is read from the trajectory's ``extra_fields["reward_extra_info"]``.
TOKEN_REWARD_FIELD = "rm_scores"

Rollout = tuple[list[Hashable], list[list[int]], list[list[float]]]


def online_rm_config(config: DictConfig) -> "OnlineRMConfig":
    """The run's ``online_rm`` section, validated; ``server_url`` defaults to the reward manager's server, or, when
    its RM runs on managed replicas, ``reward_model`` to that RM (every replica gets each publish)."""
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.trainable import check_trainable_head

    if "online_rm" not in config:
        raise ConfigError(f"trainer mode {TRAINER_MODE!r} needs an online_rm section: add "
                          "+online_rm.model_path=... (see recipes/grpo_math_online_rm.sh)")
    options = OmegaConf.to_container(config.online_rm, resolve=True)
    managed = OmegaConf.select(config, "reward.reward_kwargs.replicas", default=None) is not None
    if "server_url" not in options and "reward_model" not in options and managed:
        options["reward_model"] = DEFAULT_RM_NAME  # the one RM of reward_kwargs, on its managed replicas
    elif "server_url" not in options and "reward_model" not in options:
        urls = OmegaConf.select(config, "reward.reward_kwargs.server_url", default=DEFAULT_SERVER_URL)
        urls = [urls] if isinstance(urls, str) else list(urls)
        if len(urls) != 1:
            raise ConfigError(f"online_rm.server_url is unset and reward.reward_kwargs.server_url lists {urls}: "
                              "set +online_rm.server_url to the server whose weights the RM trainer updates")
        options["server_url"] = urls[0]
    cfg = OnlineRMConfig.from_dict(options)
    check_trainable_head(cfg.model_path)
    managed_rms = [o.name for o in run_reward_models(config) if o.replicas is not None]
    if cfg.reward_model is not None and cfg.reward_model not in managed_rms:
        raise ConfigError(f"online_rm.reward_model={cfg.reward_model!r} is not a reward model on managed replicas "
                          f"(this run's: {managed_rms or 'none'}): name one of them, or set online_rm.server_url "
                          "to the server the RM trainer updates")
    return cfg


def build_online_rm(config: DictConfig, actor_pool: Any = None) -> "OnlineRewardModel":
    """The RM trainer worker group described by the run's ``online_rm`` section (``actor_pool``: the actor's
    Ray resource pool, where ``online_rm.placement=colocated`` puts it)."""
    from verl_vllm_rm.online.driver import OnlineRewardModel

    return OnlineRewardModel(online_rm_config(config), actor_pool)


def actor_resource_pool(trainer: Any) -> Any:
    """The Ray resource pool of the trainer's actor (verl's v1 trainer: whichever actor role it maps)."""
    from verl.trainer.ppo.utils import Role

    role = next(r for r in (Role.Actor, Role.ActorRolloutRef, Role.ActorRollout) if r in trainer.role_worker_mapping)
    return trainer.resource_pool_manager.get_resource_pool(role)


def resume_reward_model(online_rm: "OnlineRewardModel", folder: str) -> dict[str, float]:
    """Continue the RM from the checkpoint in ``folder`` and publish it, so the server scores like it again.

    A checkpoint without RM state (saved by a run without online RM training) resumes
    from the initial RM, with a warning; that, too, is published.
    """
    from verl_vllm_rm.online.export import RM_STATE_FILE

    rm_folder = os.path.join(folder, RM_CHECKPOINT_DIR)
    if not os.path.exists(os.path.join(rm_folder, RM_STATE_FILE)):
        logger.warning("checkpoint %s has no online RM state (%s): the RM restarts from online_rm.model_path",
                       folder, RM_CHECKPOINT_DIR)
        rm_folder = None
    return online_rm.resume(rm_folder)


def _extra_reward(row: Any, key: str) -> float:
    info = reward_extra_info(row)
    if key not in info:
        raise KeyError(f"online_rm.reward_key={key!r} is not in this rollout's reward_extra_info (it has "
                       f"{sorted(info)}); set +online_rm.reward_key to one of these or to {TOKEN_REWARD_FIELD!r}")
    value = info[key]
    return float(value[0] if isinstance(value, (list, tuple)) else value)


def rollout_fields(reward_keys: list[str]) -> list[str]:
    """The fields of each trajectory an RM step needs besides the reward metrics' (``STEP_FIELDS``)."""
    return ["prompts", *dict.fromkeys(TOKEN_REWARD_FIELD if key == TOKEN_REWARD_FIELD else "extra_fields"
                                      for key in reward_keys)]


def rollout_of(data: dict[str, Any], reward_keys: list[str]) -> Rollout:
    """``uid``s, unpadded prompt+response ids and the rewards of each pair source (one row per key) of a PPO
    step (read by :func:`~verl_vllm_rm.plugin.trainer_modes.read_step` with :func:`rollout_fields`)."""
    prompts, responses = unpadded(data["prompts"], data["responses"])
    sequences = [np.concatenate(row).tolist() for row in zip(prompts, responses)]
    rewards = [[float(row.sum()) for row in data[TOKEN_REWARD_FIELD].unbind()] if key == TOKEN_REWARD_FIELD
               else [_extra_reward(row, key) for row in data["extra_fields"]] for key in reward_keys]
    return list(data["uid"]), sequences, rewards


@register_trainer(TRAINER_MODE)
class OnlineRewardModelTrainer(RewardMetricsTrainer):
    """Trainer mode ``vllm_rm`` (verl's sync trainer with reward metrics) plus one RM step (and publish) per
    PPO step, and the RM's drift on a fixed probe set. The whitening statistics are saved with the RM's state."""

    state_dir = RM_CHECKPOINT_DIR

    def init(self):
        super().init()  # verl's setup, which resumes from a checkpoint (and sets global_steps) when configured
        self.online_rm = build_online_rm(self.config, actor_resource_pool(self))
        if self.global_steps > 0:
            resume_reward_model(self.online_rm, resumed_folder(self.config, self.global_steps))
        self.drift_probe: "DriftProbe | None" = None

    def _save_checkpoint(self):
        # Before verl's save: it writes the latest-checkpoint tracker last, so a crash in between never
        # leaves a tracked step without its RM state.
        folder = step_folder(self.config, self.global_steps)
        self.online_rm.save_checkpoint(os.path.join(folder, RM_CHECKPOINT_DIR))
        super()._save_checkpoint()

    def step_fields(self) -> list[str]:
        return list(dict.fromkeys([*super().step_fields(), *rollout_fields(self.online_rm.config.reward_key)]))

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        batch = super().step(metrics, timing_raw)  # reads the step's trajectories (step_fields) into step_data
        with marked_timer("online_rm", timing_raw, color="purple"):
            self.log_reward_metrics(metrics, self.train_reward_model(self.step_data))
        return batch

    def train_reward_model(self, data: dict[str, Any]) -> dict[str, float]:
        """One RM step on this PPO step's rollouts (publishing per ``online_rm.publish_every``), then the RM's
        drift on the probe set (the first call's sequences, scored before its RM step)."""
        rollout = rollout_of(data, self.online_rm.config.reward_key)
        if self.drift_probe is None:
            self.drift_probe = make_drift_probe(self.online_rm.config, rollout[1])
        return {**self.online_rm.train_on_rollout(*rollout, step=self.global_steps), **self.drift_probe.measure()}


def make_drift_probe(config: "OnlineRMConfig", sequences: list[list[int]]) -> "DriftProbe":
    """The drift probe on the RM trainer's server, or on a replica in routing of its managed RM (the first
    sequences of a step, scored now)."""
    from verl_vllm_rm.client.http import JsonHttp
    from verl_vllm_rm.online.drift import DriftProbe

    def server() -> JsonHttp:
        if config.server_url is not None:
            return JsonHttp(config.server_url, config.api_key)
        import ray

        from verl_vllm_rm.replicas.fleet import FleetError, fleet_name

        fleet = ray.get_actor(fleet_name(config.reward_model))
        urls = ray.get(fleet.urls.remote())
        if not urls:
            raise FleetError(f"no replica of reward model {config.reward_model!r} is in routing to probe drift on "
                             f"({replica_states(ray.get(fleet.replica_status.remote()))}): a replica serves once it "
                             "is up and on the fleet's weight version. The fleet restarts one that is down and the "
                             "next publish re-syncs one behind; the replicas/* metrics and the fleet's replica logs "
                             "say why they left")
        return JsonHttp(urls[0], config.api_key)

    return DriftProbe(server, sequences)


def replica_states(statuses: list[dict[str, Any]]) -> str:
    """Each replica as routing sees it (``ReplicaFleet.replica_status``): up or down, its weight version, drained."""
    return "; ".join(f"replica {s['index']} {'up' if s['healthy'] else 'down'} on version {s['version']}"
                     + (", drained" if s["drained"] else "") + (", given up" if s["given_up"] else "")
                     for s in statuses)
