"""The trainer-side handle of online RM training: rollout batch -> best-vs-worst pairs -> a worker-group step.

``plugin/online_mode.py`` plugs it into verl's PPO loop.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Hashable, Sequence

from verl import DataProto

from verl_vllm_rm.online.bt import collate_pairs
from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.pairs import best_vs_worst_pairs
from verl_vllm_rm.online.worker import PAIR_FIELDS, RewardModelTrainingWorker


def preference_pairs(uids: Sequence[Hashable], sequences: Sequence[list[int]], rewards: Sequence[float],
                     pad_id: int, min_gap: float = 0.0, multiple_of: int = 1) -> DataProto | None:
    """Best-vs-worst pairs of each group as a ``DataProto`` (``None`` when no group has a gap).

    Trimmed to a multiple of the worker count, as ``DP_COMPUTE_PROTO`` splits evenly.
    """
    chosen, rejected = best_vs_worst_pairs(uids, sequences, rewards, min_gap)
    keep = len(chosen) - len(chosen) % multiple_of
    if keep == 0:
        return None
    batch = collate_pairs(chosen[:keep], rejected[:keep], pad_id)
    tensors = dict(zip(PAIR_FIELDS, (batch.chosen_ids, batch.chosen_mask, batch.rejected_ids, batch.rejected_mask)))
    return DataProto.from_dict(tensors=tensors)


class OnlineRewardModel:
    """The trainer-side handle: a Ray worker group training the RM on each rollout batch."""

    def __init__(self, config: OnlineRMConfig, pad_id: int) -> None:
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        self.config = config
        self.pad_id = pad_id
        # Ray actor names are global: a unique prefix lets several of these live in one Ray session.
        name = f"online_rm_{uuid.uuid4().hex[:6]}"
        # One worker per bundle (verl's default reserves 10 CPUs per bundle for colocated roles).
        pool = RayResourcePool([config.num_workers], use_gpu=config.use_gpu, max_colocate_count=1, name_prefix=name)
        worker = RayClassWithInitArgs(cls=ray.remote(RewardModelTrainingWorker),
                                      config=dataclasses.asdict(config))
        self.worker_group = RayWorkerGroup(pool, worker, name_prefix=name)
        self.worker_group.init_model()

    def train_on_rollout(self, uids: Sequence[Hashable], sequences: Sequence[list[int]],
                         rewards: Sequence[float]) -> dict[str, float]:
        pairs = preference_pairs(uids, sequences, rewards, self.pad_id, self.config.min_reward_gap,
                                 self.worker_group.world_size)
        if pairs is None:
            return {"rm/pairs": 0.0}
        out = self.worker_group.train_rm_step(pairs)
        # One value per rank (``DataProto.concat`` lists them): report the mean.
        return {k: sum(v) / len(v) if isinstance(v, list) else v for k, v in out.meta_info["metrics"].items()}

    def save_checkpoint(self, path: str) -> None:
        """Write the RM's training state (trainable weights, optimizer, step count) under ``path``."""
        self.worker_group.save_rm_checkpoint(path)

    def resume(self, path: str | None) -> dict[str, float]:
        """Restore :meth:`save_checkpoint`'s state from ``path`` (``None``: the initial RM) and publish it."""
        return self.worker_group.load_rm_checkpoint(path)[0]
