"""Trainer mode ``vllm_rm``: verl's v1 trainer plus reward metrics and alarms every step.

verl turns ``reward_extra_info`` into metrics only in validation. This trainer reads each
step's per-sample ``reward_extra_info`` from TransferQueue after verl's step, logs
``reward/*`` and ``alarm/*`` (:mod:`verl_vllm_rm.monitor`) in verl's own logger (console,
file, wandb, tensorboard), warns once per crossed alarm, and gives the rollout dump
(``trainer.rollout_data_dir``) one column per reward component. Select it with one override::

    python -m verl.trainer.main_ppo ... reward.reward_manager.name=vllm_rm trainer.v1.trainer_mode=vllm_rm

``vllm_rm`` is verl's ``sync`` mode; ``vllm_rm_colocate_async`` and ``vllm_rm_separate_async`` are
verl's asynchronous modes with the same additions. :class:`RewardMetrics` is what they add; the trainer
classes themselves, and their registration (by this package's ``verl.plugins`` entry point, so stock
``main_ppo`` finds them with no other setting), are :mod:`verl_vllm_rm.plugin.trainer_registry`'s.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from transfer_queue import KVBatchMeta
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer

from verl_vllm_rm.monitor.alarms import warnings
from verl_vllm_rm.extra_info import RM_VALID, TOKEN_REWARDS
from verl_vllm_rm.monitor.metrics import StepRewards, attribute_rises, step_metrics
from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.replicas.fleet import FleetReadings
from verl_vllm_rm.rows import VALIDATION_FIELD
from verl_vllm_rm.scoring.options import run_options
from verl_vllm_rm.plugin.server_check import check_listed_servers
from verl_vllm_rm.plugin.token_placement import place_token_rewards, placed_rewards
from verl_vllm_rm.plugin.whitening_checkpoint import WhiteningCheckpoint, whitening_keys

logger = logging.getLogger(__name__)

TRAINER_MODE = "vllm_rm"
#: what the reward metrics read of each trajectory of a step
STEP_FIELDS = ["uid", "responses", "extra_fields"]


def step_folder(config: DictConfig, global_steps: int) -> str:
    """The folder verl saves step ``global_steps``'s checkpoint in."""
    return os.path.join(os.path.abspath(config.trainer.default_local_dir), f"global_step_{global_steps}")


def resumed_folder(config: DictConfig, global_steps: int) -> str:
    """The checkpoint folder verl resumed ``global_steps`` from (``trainer.resume_mode`` auto or resume_path)."""
    if config.trainer.resume_mode == "resume_path":
        return os.path.abspath(config.trainer.resume_from_path)
    return step_folder(config, global_steps)


def reward_extra_info(row: Any) -> dict[str, Any]:
    """The reward manager's ``reward_extra_info`` of one trajectory, from its TransferQueue ``extra_fields``
    row (one-element lists unwrapped)."""
    fields = getattr(row, "data", row)
    info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
    return {k: (v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v) for k, v in info.items()}


def real_keys(batch: KVBatchMeta) -> list[str]:
    """The step's trajectory keys without the rows verl adds only to balance data-parallel ranks (tag
    ``is_padding``): they repeat real trajectories and would count twice."""
    return [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]


def read_step(batch: KVBatchMeta, fields: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The step's real trajectory keys (:func:`real_keys`) and their ``fields``, in one TransferQueue read."""
    keys = real_keys(batch)
    return keys, tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)


def step_rewards(data: dict[str, Any]) -> StepRewards:
    """The step's rewards (group, response length, reward_extra_info columns) from its :data:`STEP_FIELDS`."""
    infos = [reward_extra_info(row) for row in data["extra_fields"]]
    if not all(RM_VALID in info for info in infos):
        raise ConfigError(f"trainer mode {TRAINER_MODE!r} reads the rewards of reward.reward_manager.name=vllm_rm "
                          "and this run's rollouts have none: set reward.reward_manager.name=vllm_rm, or drop "
                          f"trainer.v1.trainer_mode={TRAINER_MODE}")
    lengths = data["responses"].offsets().diff().tolist()
    return StepRewards.from_rows(list(data["uid"]), lengths, infos)


def dump_columns(dump_keys: list[str], keys: list[str], rewards: StepRewards) -> dict[str, list]:
    """Per-row columns for verl's rollout dump, in its row order (``dump_keys``); None where a row is not
    one of the step's real trajectories or lacks the value."""
    row_of = {key: i for i, key in enumerate(keys)}
    rows = [row_of.get(key) for key in dump_keys]

    def column(values: np.ndarray) -> list:
        return [None if i is None or np.isnan(values[i]) else float(values[i]) for i in rows]

    out = {name: column(values) for name, values in rewards.columns.items()}
    out["response_length"] = column(rewards.response_length)
    out["group"] = [None if i is None else str(rewards.groups[i]) for i in rows]
    return out


class ValidationTagging:
    """verl's agent-loop manager, tagging each validation prompt with :data:`~verl_vllm_rm.rows.VALIDATION_FIELD`.

    verl 0.9.1 calls reward managers once per trajectory and its agent loop drops the batch's ``validate`` flag on
    the way (``AgentLoopWorkerTQ.generate_sequences``); the prompt's own fields reach the reward manager. verl's
    ``_validate`` generates through the manager ``fit`` was given, so wrapping it there reaches every one. A tag per
    prompt holds in every mode, also where the async modes roll out training batches during validation. Tagged,
    the samples use ``val_kwargs.n`` groups, compare with the reference under ``pairwise=auto`` and leave the
    whitening statistics alone."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def generate_sequences(self, batch: Any) -> Any:
        if "validate" in batch and batch["validate"]:
            tu.assign_non_tensor_data(batch, VALIDATION_FIELD, True)
        return self._manager.generate_sequences(batch)


class RewardMetrics:
    """The reward metrics and alarms, on top of one of verl's v1 trainers (``base_mode``; the classes are
    :mod:`~verl_vllm_rm.plugin.trainer_registry`'s)."""

    base_mode = "sync"
    #: where in each ``global_step_N`` folder this trainer keeps its state (the whitening statistics)
    state_dir = "vllm_rm"
    #: it writes ``step_reward=token``'s per-token rewards into ``rm_scores`` (the reward manager reads this
    #: through verl's trainer registry, and refuses token-level rewards under a trainer without it)
    places_token_rewards = True

    # verl picks the replay buffer, prompt refill, checkpoint contents and the
    # ``trainer.v1.<mode>`` options by ``self.trainer_mode``: the base trainer's mode.
    @property
    def trainer_mode(self) -> str:
        return self.base_mode

    @trainer_mode.setter
    def trainer_mode(self, _configured: str) -> None:
        """verl assigns ``config.trainer.v1.trainer_mode`` (our registry name); behaviour stays the base's."""

    def init(self):
        options = run_options(self.config)  # None unless the reward manager is vllm_rm
        if options is not None:  # a wrong server_url stops the run now, not after verl's set-up and a rollout
            check_listed_servers(options)
        super().init()  # verl's setup: reward-loop workers built, a checkpoint resumed (global_steps set)
        # every managed RM's replicas up before anything is scored or published (a resumed online RM publishes next)
        reward_models = options.rm_options if options is not None else ()
        self.fleets = FleetReadings({o.name: (o.replicas, o.client.api_key) for o in reward_models if o.replicas is not None})
        whitened = whitening_keys(reward_models)
        self.whitening = WhiteningCheckpoint(whitened, self.get_reward_handles()) if whitened else None
        if self.whitening is not None and self.global_steps > 0:
            self.whitening.resume(os.path.join(resumed_folder(self.config, self.global_steps), self.state_dir))
        self.rm_normalized = bool(OmegaConf.select(self.config, "reward.reward_kwargs.normalize", default=False))
        self.attribute_rises = attribute_rises(options.attribute_alarms if options is not None else ())
        self.step_rewards: tuple[list[str], StepRewards] | None = None
        self.step_data: dict[str, Any] = {}  # the last step's trajectories, as read_step gave them
        self.token_level = any(o.step_reward == "token" for o in reward_models)
        self._dumping_rollouts: KVBatchMeta | None = None  # the batch whose rollouts verl is dumping

    def step_fields(self) -> list[str]:
        """The fields of each trajectory this trainer reads after a step (a subclass adds its own: one read)."""
        return list(STEP_FIELDS)

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        batch = super().step(metrics, timing_raw)
        with marked_timer("reward_metrics", timing_raw, color="yellow"):
            keys, self.step_data = read_step(batch, self.step_fields())
            self.step_rewards = keys, step_rewards(self.step_data)
            self.log_reward_metrics(metrics, step_metrics(self.step_rewards[1], self.rm_normalized,
                                                          self.attribute_rises))
            metrics.update(self.fleets.step_metrics())
        return batch

    def fit(self, agent_loop_manager):
        return super().fit(ValidationTagging(agent_loop_manager))

    # verl's _step_once computes every training batch's advantage from rm_scores, here: each step's reward is put
    # on its token first (token_placement)
    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        if self.token_level:
            metrics.update(place_token_rewards(batch))
        return super()._compute_advantage(batch, metrics)

    def _save_checkpoint(self):
        if self.whitening is not None:
            self.whitening.save(os.path.join(step_folder(self.config, self.global_steps), self.state_dir))
        super()._save_checkpoint()

    def log_reward_metrics(self, metrics: dict, new: dict[str, float]) -> None:
        """Add ``new`` to the step's metrics, with one warning line per alarm it trips."""
        metrics.update(new)
        for line in warnings(new, self.global_steps):
            logger.warning(line)

    # verl's rollout dump keeps only the text, the total score and the trajectory key: while verl writes
    # it, each row also gets this step's reward components (matched by the key verl passes as "uid").
    def _log_rollout_data(self, batch, timing_raw, rollout_data_dir):
        self._dumping_rollouts = batch
        try:
            return super()._log_rollout_data(batch, timing_raw, rollout_data_dir)
        finally:
            self._dumping_rollouts = None

    def _dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        if self._dumping_rollouts is not None and self.step_rewards is not None:
            keys, rewards = self.step_rewards
            dump_keys = list(reward_extra_infos_dict["uid"])
            columns = dump_columns(dump_keys, keys, rewards)
            if self.token_level:  # the per-token rewards verl trained on
                columns[TOKEN_REWARDS] = placed_rewards(self._dumping_rollouts.partition_id, dump_keys)
            reward_extra_infos_dict = {**columns, **reward_extra_infos_dict}
        return super()._dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
