"""Online RM training inside a verl PPO/GRPO run (opt-in): trainer modes ``vllm_rm_online[_<async mode>]``.

After each PPO step this trainer reads the step's rollouts (``uid``, prompt and
response ids, reward) from verl's TransferQueue, in the same read as the reward
metrics of trainer mode ``vllm_rm``, builds best-vs-worst preference pairs per
prompt group, and runs one Bradley-Terry step on a separate Ray worker group
(:class:`~verl_vllm_rm.online.driver.OnlineRewardModel`), whose hook publishes the
new RM weights into the running reward server.

Enable it with one override (see ``recipes/grpo_math_online_rm.sh``)::

    python -m verl.trainer.main_ppo trainer.v1.trainer_mode=vllm_rm_online \\
        +online_rm.model_path=... [+online_rm.training_mode=lora ...]  (server_url: the reward manager's)

``vllm_rm_online`` is verl's ``sync`` trainer: the RM step runs inside the PPO step, while
nothing is generated. ``vllm_rm_online_colocate_async`` and ``vllm_rm_online_separate_async``
are verl's asynchronous trainers, where generation goes on between steps: the RM step runs
after verl's ``on_step_end`` (the policy's weights synced, generation resumed), and
``+online_rm.max_staleness=K`` bounds the RM versions one batch was scored by
(:mod:`~verl_vllm_rm.plugin.rm_staleness`).

The trainer classes are :mod:`~verl_vllm_rm.plugin.trainer_registry`'s, which the package's
``verl.plugins`` entry point registers in every process (no environment variable). Needs verl's
v1 trainer dependencies (``transfer_queue``, installed by ``make setup``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Hashable

import numpy as np
from omegaconf import DictConfig, OmegaConf
from transfer_queue import KVBatchMeta
from verl.utils.debug import marked_timer

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.protocol.defaults import DEFAULT_SERVER_URL
from verl_vllm_rm.plugin.trainer_modes import resumed_folder, reward_extra_info, step_folder
from verl_vllm_rm.rows import unpadded
from verl_vllm_rm.scoring.options import DEFAULT_RM_NAME, run_reward_models

# ``verl_vllm_rm.online.driver`` is imported where it is used: it starts Ray worker groups, which the many
# processes that register this trainer mode (every process that imports verl's trainer) never need. So is
# ``plugin.rm_staleness``: it imports verl's trainer package, whose first import registers the trainer modes,
# which import this module (a cycle when it is imported first).

if TYPE_CHECKING:
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.drift import DriftProbe
    from verl_vllm_rm.online.driver import OnlineRewardModel
    from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer

logger = logging.getLogger(__name__)

TRAINER_MODE = "vllm_rm_online"
RM_CHECKPOINT_DIR = "online_rm"  # beside verl's actor/ and data.pt in each global_step_N folder
#: The reward verl writes for every trajectory (token-level, summed per sample); any other
#: ``reward_key`` is read from the trajectory's ``extra_fields["reward_extra_info"]``.
TOKEN_REWARD_FIELD = "rm_scores"

Rollout = tuple[list[Hashable], list[list[int]], list[list[float]]]


def online_rm_options(config: DictConfig) -> "OnlineRMConfig":
    """The run's ``online_rm`` section, validated (nothing read from disk); ``server_url`` defaults to the reward
    manager's servers (every one gets each publish), or, when its RM runs on managed replicas, ``reward_model`` to
    that RM (every replica gets each publish)."""
    from verl_vllm_rm.online.config import OnlineRMConfig

    if "online_rm" not in config:
        mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default=TRAINER_MODE)
        raise ConfigError(f"trainer mode {mode!r} needs an online_rm section: add "
                          "+online_rm.model_path=... (see recipes/grpo_math_online_rm.sh)")
    options = OmegaConf.to_container(config.online_rm, resolve=True)
    managed = OmegaConf.select(config, "reward.reward_kwargs.replicas", default=None) is not None
    if "server_url" not in options and "reward_model" not in options and managed:
        options["reward_model"] = DEFAULT_RM_NAME  # the one RM of reward_kwargs, on its managed replicas
    elif "server_url" not in options and "reward_model" not in options:
        options["server_url"] = OmegaConf.select(config, "reward.reward_kwargs.server_url", default=DEFAULT_SERVER_URL)
    return OnlineRMConfig.from_dict(options)


def online_rm_config(config: DictConfig) -> "OnlineRMConfig":
    """:func:`online_rm_options`, and the RM they name checked: a head the RM trainer can train, on managed
    replicas of this run when ``reward_model`` names it."""
    from verl_vllm_rm.online.trainable import check_trainable_head

    cfg = online_rm_options(config)
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


class OnlineRewardModelTraining:
    """Online RM training on top of trainer mode ``vllm_rm[_<mode>]`` (one of verl's v1 trainers with the reward
    metrics): the RM's worker group, checkpoint and resume, what an RM step reads and the step itself; when it
    runs is :class:`RMStepInStep`'s or :class:`RMStepAfterStepEnd`'s (the six trainer classes are
    :mod:`~verl_vllm_rm.plugin.trainer_registry`'s). The whitening statistics are saved with
    the RM's state."""

    state_dir = RM_CHECKPOINT_DIR

    def init(self):
        from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer

        super().init()  # verl's setup, which resumes from a checkpoint (and sets global_steps) when configured
        self.online_rm = build_online_rm(self.config, actor_resource_pool(self))
        if self.global_steps > 0:
            if isinstance(self.replay_buffer, RMStalenessBuffer):
                self.replay_buffer.retire_finished_groups()
            self.note_publish(resume_reward_model(self.online_rm, resumed_folder(self.config, self.global_steps)))
        self.drift_probe: "DriftProbe | None" = None

    def _save_checkpoint(self):
        # Before verl's save: it writes the latest-checkpoint tracker last, so a crash in between never
        # leaves a tracked step without its RM state.
        folder = step_folder(self.config, self.global_steps)
        self.online_rm.save_checkpoint(os.path.join(folder, RM_CHECKPOINT_DIR))
        super()._save_checkpoint()

    def step_fields(self) -> list[str]:
        return list(dict.fromkeys([*super().step_fields(), *rollout_fields(self.online_rm.config.reward_key)]))

    def train_reward_model(self, data: dict[str, Any]) -> dict[str, float]:
        """One RM step on this PPO step's rollouts (publishing per ``online_rm.publish_every``), then the RM's
        drift on the probe set (the first call's sequences, scored before its RM step)."""
        rollout = rollout_of(data, self.online_rm.config.reward_key)
        if self.drift_probe is None:
            self.drift_probe = make_drift_probe(self.online_rm.config, rollout[1])
        metrics = {**self.online_rm.train_on_rollout(*rollout, step=self.global_steps), **self.drift_probe.measure()}
        self.note_publish(metrics)
        return metrics

    def note_publish(self, metrics: dict[str, float]) -> None:
        """After a publish (``rm/published_version`` in its metrics), raise the RM staleness floor of an
        :class:`~verl_vllm_rm.plugin.rm_staleness.RMStalenessBuffer` (``online_rm.max_staleness``), reported as
        ``rm/staleness_floor``."""
        from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer

        if isinstance(self.replay_buffer, RMStalenessBuffer) and "rm/published_version" in metrics:
            self.replay_buffer.published(int(metrics["rm/published_version"]))
            metrics["rm/staleness_floor"] = float(self.replay_buffer.floor)


class RMStepInStep:
    """verl's sync trainer: the RM step right after verl's step (nothing is generated until the next one)."""

    def _build_replay_buffer(self):
        if OmegaConf.select(self.config, "online_rm.max_staleness", default=None) is not None:
            raise ConfigError(
                f"online_rm.max_staleness bounds the RM versions a batch of verl's asynchronous trainers was scored "
                f"by; trainer mode {TRAINER_MODE!r} (verl's sync trainer) publishes between steps, so each batch is "
                f"scored by one version already: drop +online_rm.max_staleness, or train in "
                f"{TRAINER_MODE}_colocate_async or {TRAINER_MODE}_separate_async")
        return super()._build_replay_buffer()

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        batch = super().step(metrics, timing_raw)  # reads the step's trajectories (step_fields) into step_data
        with marked_timer("online_rm", timing_raw, color="purple"):
            self.log_reward_metrics(metrics, self.train_reward_model(self.step_data))
        return batch


class RMStepAfterStepEnd:
    """verl's asynchronous trainers: the RM step after verl's ``on_step_end``, or before the checkpoint on a save
    step.

    colocate_async pauses generation from ``on_sample_end`` to the end of ``on_step_end`` (the policy's weights
    synced, generation resumed); separate_async generates all along but syncs the policy in ``on_step_end``. An RM
    step inside ``step()`` would hold generation (or the policy's sync) for the RM step and its publish; after
    ``on_step_end`` only the server's reload pauses scoring. verl submits each step's prompts in that step's
    ``prepare_step``, which would come after the RM step: the next step's are submitted before it instead
    (:meth:`_submit_next_batch`), so the rollout generates them while the RM trains and publishes. verl saves the
    checkpoint before ``on_step_end``: on those steps the RM step runs first (generation is paused there in
    colocate_async anyway), so the checkpoint holds the RM after this step. Its metrics reach the step's through
    ``_pending_sync_metrics``, which verl merges after ``on_step_end`` (separate_async assigns it there: added
    after).
    """

    def init(self):
        super().init()
        self._rm_step_due = False
        self._rm_metrics: dict[str, float] = {}
        self._next_batch_submitted = False

    def _build_replay_buffer(self):
        from verl_vllm_rm.plugin.rm_staleness import trained_rm_version_keys

        online = online_rm_options(self.config)
        if online.max_staleness is None:
            return super()._build_replay_buffer()
        return staleness_buffer(self, online.max_staleness, trained_rm_version_keys(run_reward_models(self.config),
                                                                                    online))

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        batch = super().step(metrics, timing_raw)  # reads the step's trajectories (step_fields) into step_data
        self._rm_step_due = True
        return batch

    def _save_checkpoint(self):
        self._run_rm_step()
        super()._save_checkpoint()

    def on_step_end(self):
        super().on_step_end()
        self._submit_next_batch()
        self._run_rm_step()
        self._pending_sync_metrics = dict(getattr(self, "_pending_sync_metrics", None) or {})
        self.log_reward_metrics(self._pending_sync_metrics, self._rm_metrics)
        self._rm_metrics = {}

    def _submit_next_batch(self) -> None:
        """The next step's prompts, submitted now instead of in its ``prepare_step`` (the same batch: the dataloader
        is only read there), so generation never waits for an RM step to have work. Not after the last step, nor
        with verl's rollout skip (``skip.rollout_tq``), which keys a submission by the step that makes it."""
        if not submits_next_batch_early(self.global_steps, self.total_training_steps,
                                        bool(self.config.skip.rollout_tq.enable)):
            return
        super()._add_batch_to_generate()
        self._next_batch_submitted = True

    def _add_batch_to_generate(self):
        if self._next_batch_submitted:  # submitted by the step before (_submit_next_batch)
            self._next_batch_submitted = False
            return
        super()._add_batch_to_generate()

    def _run_rm_step(self) -> None:
        """The step's RM step, once."""
        if self._rm_step_due:
            self._rm_step_due = False
            with marked_timer("online_rm", self.timing_raw, color="purple"):
                self._rm_metrics = self.train_reward_model(self.step_data)


def submits_next_batch_early(step: int, total_steps: int, rollout_skip: bool) -> bool:
    """Whether an asynchronous trainer's step ``step`` submits the next step's prompts before its RM step: every
    step but the last (there is no next one), and never under verl's rollout skip (``skip.rollout_tq``), which keys
    each submission by the step that makes it (the next step then submits its own in its ``prepare_step``)."""
    return step < total_steps and not rollout_skip


def staleness_buffer(trainer: Any, max_staleness: int, version_keys: tuple[str, ...]) -> "RMStalenessBuffer":
    """The replay buffer verl builds for its asynchronous trainers (``PPOTrainer._build_replay_buffer``, DAPO's
    group filter included), as an :class:`~verl_vllm_rm.plugin.rm_staleness.RMStalenessBuffer`."""
    from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer

    sampler = trainer.config.trainer.v1.sampler
    custom = sampler.get("custom_sampler", None)
    if custom is not None and custom.get("path") and custom.get("name"):
        raise ConfigError(f"online_rm.max_staleness evicts stale groups in a replay buffer of its own (verl's "
                          f"asynchronous one), and trainer.v1.sampler.custom_sampler names another "
                          f"({custom.get('name')}): drop one of them")
    return RMStalenessBuffer(
        trainer_mode=trainer.trainer_mode, trainer_config=trainer.config.trainer.v1.get(trainer.trainer_mode, {}),
        max_off_policy_threshold=sampler.max_off_policy_threshold,
        max_off_policy_strategy=sampler.max_off_policy_strategy, sampler_kwargs=sampler.sampler_kwargs,
        refill_fn=trainer._add_prompts_to_generate, filter_groups_metric=trainer._resolve_filter_groups_metric(),
        sync_refill_failed_groups=bool(sampler.get("sync_refill_failed_groups", False)),
        max_staleness=max_staleness, version_keys=version_keys)


def make_drift_probe(config: "OnlineRMConfig", sequences: list[list[int]]) -> "DriftProbe":
    """The drift probe on the RM trainer's server (of a list: the one that serves the newest version), or on a
    replica in routing of its managed RM (the first sequences of a step, scored now)."""
    from verl_vllm_rm.client.http import JsonHttp
    from verl_vllm_rm.online.drift import DriftProbe

    def server() -> JsonHttp:
        if config.server_url is not None:
            return JsonHttp(newest_server(config.server_url, config.api_key), config.api_key)
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


def newest_server(urls: list[str], api_key: str | None) -> str:
    """Of ``urls``, the first that serves the newest weight version: with ``on_server_failure=leave_behind`` one
    may be behind, down or hung. The only one, unasked."""
    if len(urls) == 1:
        return urls[0]
    from verl_vllm_rm.client.http import served_versions
    from verl_vllm_rm.client.reward_client import RewardServerError

    versions = served_versions(urls, api_key)
    if not versions:
        raise RewardServerError(f"none of online_rm.server_url {urls} answered /health ok within 5 s with its weight "
                                "version: the drift probe has no server to score on")
    newest = max(versions.values())
    return next(url for url, version in versions.items() if version == newest)


def replica_states(statuses: list[dict[str, Any]]) -> str:
    """Each replica as routing sees it (``ReplicaFleet.replica_status``): up or down, its weight version, drained."""
    return "; ".join(f"replica {s['index']} {'up' if s['healthy'] else 'down'} on version {s['version']}"
                     + (", drained" if s["drained"] else "") + (", given up" if s["given_up"] else "")
                     for s in statuses)
