"""Bounded RM staleness in verl's asynchronous trainers: ``+online_rm.max_staleness=K``.

In ``colocate_async`` and ``separate_async`` a trajectory is scored as it finishes and its prompt group then waits in
verl's replay buffer while the RM trains and publishes, so one PPO batch can hold scores of many RM versions.
:class:`RMStalenessBuffer` is verl's ``ReplayBufferAsync`` with one more eviction reason beside verl's own (groups
past ``max_off_policy_threshold``, DAPO-filtered, failed): a finished group with a trajectory scored by the trained
RM below ``floor = newest published version - K + 1``. verl clears it and refills as many prompts, as for its own
reasons, so every batch's trained-RM versions lie in ``[floor, newest]``: at most ``K`` versions. The trainer (the
same process) raises the floor after each publish (:meth:`RMStalenessBuffer.published`).

Evicted, not scored again: verl scores a trajectory once, when it finishes, and keeps that reward.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable, Sequence

import numpy as np
import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.plugin.trainer_modes import reward_extra_info
from verl_vllm_rm.extra_info import weight_version_key
from verl_vllm_rm.scoring.options import RewardModelOptions, per_member_columns

#: verl's eviction reasons (past the off-policy threshold, DAPO-filtered, failed, DAPO's value counts), then the
#: groups scored below the floor
Reasons = tuple[set[str], set[str], set[str], Counter, set[str]]


def trained_rm_version_keys(rm_options: Sequence[RewardModelOptions], online: OnlineRMConfig) -> tuple[str, ...]:
    """The ``reward_extra_info`` keys holding the trained RM's weight version per trajectory: one per reward model
    of the manager served by what ``online_rm`` publishes to (two names can read one server, e.g. two weightings of
    one attribute RM)."""
    trained = [o.name for o in rm_options if o.name == online.reward_model
               or (o.replicas is None and set(online.server_url or ()) & set(o.client.server_url))]
    if not trained:
        target = (f"online_rm.reward_model={online.reward_model!r}" if online.reward_model is not None
                  else f"online_rm.server_url={online.server_url!r}")
        served = {o.name: "managed replicas" if o.replicas is not None else list(o.client.server_url)
                  for o in rm_options}
        raise ConfigError(f"online_rm.max_staleness bounds the versions of the trained RM that scored each batch, and "
                          f"no reward model of reward.reward_kwargs is served by what online_rm trains ({target}; "
                          f"the manager's: {served or 'none: reward.reward_manager.name is not vllm_rm'}): point "
                          "online_rm at one of them, or drop +online_rm.max_staleness")
    per_member = per_member_columns(rm_options)
    return tuple(dict.fromkeys(weight_version_key(name, per_member=per_member) for name in trained))


def trajectory_versions(infos: Iterable[dict[str, Any]], keys: Sequence[str]) -> np.ndarray:
    """The trained RM's version that scored each trajectory (the oldest over ``keys``); NaN where none did (a
    masked score: -1 or None; a route without that RM)."""
    table = np.array([[np.nan if info[key] is None else float(info[key]) for key in keys] for info in infos],
                     dtype=np.float64).reshape(-1, len(keys))
    table[table < 0] = np.nan
    return np.fmin.reduce(table, axis=1)


def oldest_per_group(uids: Sequence[str], versions: np.ndarray) -> dict[str, float]:
    """Each group's oldest version (``inf``: no trajectory of it was scored by the trained RM)."""
    groups, index = np.unique(np.asarray(uids, dtype=str), return_inverse=True)
    oldest = np.full(len(groups), np.inf)
    np.fmin.at(oldest, index, versions)
    return dict(zip(groups.tolist(), oldest.tolist()))


class RMStalenessBuffer(ReplayBufferAsync):
    """verl's asynchronous replay buffer, also evicting finished groups scored by the trained RM below the floor
    (evicted and refilled in verl's own pass: ``training/rm_staleness/evicted_samples`` counts the groups, as
    verl's ``off_policy/evicted_samples`` does)."""

    def __init__(self, *args: Any, max_staleness: int, version_keys: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_staleness = max_staleness
        self.version_keys = tuple(version_keys)
        self.floor: int | None = None  # None until a publish: every score is then on the server's first version
        # Finished groups are immutable: each one's oldest version is read once (as verl caches DAPO's reading).
        self._oldest: dict[str, dict[str, float]] = defaultdict(dict)
        self._retired: dict[str, set[str]] = defaultdict(set)

    def published(self, version: int) -> None:
        """The trained RM now serves ``version``: from the next poll on, groups scored below
        ``version - max_staleness + 1`` are evicted."""
        self.floor = version - self.max_staleness + 1

    def retire_finished_groups(self, partition_id: str = "train") -> int:
        """Evict, at the next poll, every group finished now, whatever version it carries: on resume, the groups
        verl restored from the checkpoint's TransferQueue were scored by the server before the restart, whose
        versions this run's cannot be compared with. Returns how many."""
        self._sync_metadata_from_transfer_queue()
        self._retired[partition_id] = set(self.finished_keys[partition_id])
        return len(self._retired[partition_id])

    def _rm_stale_keys(self, partition_id: str) -> set[str]:
        """Finished groups scored below the floor, and retired ones still finished."""
        if partition_id == "val":
            return set()
        finished = self.finished_keys[partition_id]
        retired = self._retired[partition_id]
        retired &= finished  # the rest were evicted (or sampled) since
        if self.floor is None:
            return set(retired)
        oldest = self._oldest[partition_id]
        for uid in oldest.keys() - finished:
            del oldest[uid]
        new = finished - oldest.keys()
        keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in new]
        if keys:
            rows = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields"])
            infos = [reward_extra_info(row) for row in rows["extra_fields"]]
            missing = sorted({key.split("_")[0] for key, info in zip(keys, infos)
                              if not all(k in info for k in self.version_keys)})
            if missing:
                raise ConfigError(f"online_rm.max_staleness reads each trajectory's RM weight version from "
                                  f"reward_extra_info {list(self.version_keys)}, and finished groups {missing[:5]} "
                                  "have none: their rewards are not vllm_rm's (reward.reward_manager.name=vllm_rm) "
                                  "or not from the RM online_rm trains")
            oldest.update(oldest_per_group([key.split("_")[0] for key in keys],
                                           trajectory_versions(infos, self.version_keys)))
        return retired | {uid for uid, version in oldest.items() if version < self.floor}

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str) -> Reasons:
        return (*super()._terminal_eviction_reasons(global_steps, partition_id), self._rm_stale_keys(partition_id))

    def _sampleable_terminal_keys(self, partition_id: str, eviction_reasons: Reasons) -> set[str]:
        return super()._sampleable_terminal_keys(partition_id, eviction_reasons[:4]) - eviction_reasons[4]

    def _evict_terminal_groups(self, global_steps: int, partition_id: str,
                               eviction_reasons: Reasons) -> tuple[set[str], int, int, dict]:
        evicted, stale_count, dapo_count, metrics = super()._evict_terminal_groups(
            global_steps, partition_id, eviction_reasons[:4])
        rm_stale = eviction_reasons[4] - evicted  # a group verl evicts for its own reason is counted there
        if rm_stale:
            metrics[f"{self._metrics_prefix(partition_id)}/rm_staleness/evicted_samples"] = len(rm_stale)
            self._clear_groups(partition_id, rm_stale)
        return evicted | rm_stale, stale_count, dapo_count, metrics
