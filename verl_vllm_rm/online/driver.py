"""The trainer-side handle of online RM training: rollout batch -> best-vs-worst pairs -> a worker-group step.

``plugin/online_mode.py`` plugs it into verl's PPO loop.
"""

from __future__ import annotations

import logging
import random
import uuid
from typing import Any, Hashable, Sequence

from verl_vllm_rm.client.http import ephemeral_range_start
from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.pairs import best_vs_worst_pairs
from verl_vllm_rm.online.placement import place_rm_ranks
from verl_vllm_rm.online.worker import RewardModelWorker
from verl_vllm_rm.options import flat_values

logger = logging.getLogger(__name__)


def mean_of(value: Any) -> float:
    """A metric verl gathered per micro-batch and rank (nested lists), as one number."""
    if isinstance(value, (list, tuple)):
        flat = [mean_of(v) for v in value]
        return sum(flat) / len(flat)
    return float(value)


def master_port_range(rng: random.Random | None = None) -> list[int]:
    """Where the RM ranks' torch.distributed store may listen: a random window of 1000 ports below the kernel's
    ephemeral range.

    verl's default takes a port the kernel hands out for ``bind(0)``, closes it and binds it again in rank 0's
    ``init_process_group``; in between, any outgoing connection on the node may be given the same port as its
    source (seen here: EADDRINUSE at the RM worker's start while the other tests' HTTP traffic ran). Ports
    below the ephemeral range are never handed out as source ports; the random window keeps two groups starting
    at once apart, and verl tries the window's ports in turn until one binds.
    """
    low = (rng or random).randrange(10000, max(ephemeral_range_start() - 1000, 10001))
    return [low, low + 1000]


class RewardModelIdleError(RuntimeError):
    """Online RM training was asked for, and the RM has had no preference pairs for ``max_idle_steps`` steps."""


Pairs = tuple[list[list[int]], list[list[int]], list[int]]


def preference_pairs(uids: Sequence[Hashable], sequences: Sequence[list[int]],
                     rewards: Sequence[float] | Sequence[Sequence[float]], min_gap: float = 0.0,
                     multiple_of: int = 1) -> Pairs:
    """Best-vs-worst pairs of each group (chosen, rejected, and the pair source of each), trimmed to a multiple
    of the RM's rank count: each rank trains on an equal share."""
    chosen, rejected, sources = best_vs_worst_pairs(uids, sequences, rewards, min_gap)
    keep = len(chosen) - len(chosen) % multiple_of
    return chosen[:keep], rejected[:keep], sources[:keep] if keep else sources


def idle_message(config: OnlineRMConfig, step: int | None, groups: int, found: int, workers: int) -> str:
    """Why a PPO step gave the RM nothing to learn from, and what to change."""
    at = f"PPO step {step}" if step is not None else "this PPO step"
    if found:
        why = (f"only {found} of the {groups} prompt groups had a reward gap, fewer than the {workers} RM workers "
               "(each needs a pair): lower +online_rm.num_workers or train on larger batches")
    else:
        why = (f"in all {groups} prompt groups the best and worst responses are within online_rm.min_reward_gap="
               f"{config.min_reward_gap:g} on the pair source online_rm.reward_key={config.reward_key}: set "
               "+online_rm.reward_key to rewards that vary within a group (other reward_extra_info keys, tried in "
               "order, or rm_scores last), lower +online_rm.min_reward_gap, or sample more responses per prompt "
               "(actor_rollout_ref.rollout.n)")
    return f"online RM: no preference pairs at {at}, so the RM did not train: {why}"


class OnlineRewardModel:
    """The trainer-side handle: a Ray worker group of :class:`RewardModelWorker` (verl's engine) training the RM
    on each rollout batch; on its own resource pool, or on ``colocated_pool`` (the actor's)."""

    def __init__(self, config: OnlineRMConfig, colocated_pool: Any = None) -> None:
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        self.config = config
        # Ray actor names are global: a unique prefix lets several of these live in one Ray session.
        name = f"online_rm_{uuid.uuid4().hex[:6]}"
        self.own_pool = None  # the pool this handle created (placement=separate), released by close()
        if config.placement == "colocated":
            if colocated_pool is None:
                raise ValueError("online_rm.placement=colocated needs the actor's resource pool (the trainer "
                                 "mode vllm_rm_online passes it)")
            pool = colocated_pool
        else:  # one worker per bundle (verl's default reserves 10 CPUs per bundle for colocated roles)
            ranks_per_node, groups = place_rm_ranks(config, name)  # verl's own wait for a placement has no timeout
            pool = self.own_pool = RayResourcePool(ranks_per_node, use_gpu=config.use_gpu, max_colocate_count=1,
                                                   name_prefix=name)
            pool.pgs = groups
        worker = RayClassWithInitArgs(cls=ray.remote(RewardModelWorker), config=config.training_worker_config(),
                                      online=flat_values(config))
        self.worker_group = RayWorkerGroup(pool, worker, name_prefix=name, master_port_range=master_port_range())
        self.worker_group.init_model()
        self.idle_steps = 0  # PPO steps in a row without an RM step

    def train_on_rollout(self, uids: Sequence[Hashable], sequences: Sequence[list[int]],
                         rewards: Sequence[float] | Sequence[Sequence[float]],
                         step: int | None = None) -> dict[str, float]:
        """One RM step on the rollout's best-vs-worst pairs (``rewards``: one row per pair source of
        ``reward_key``, or one reward per response). A rollout without pairs is logged at once and counted
        (``rm/trained`` 0, ``rm/idle_steps``); ``max_idle_steps`` of them in a row stop the run."""
        workers = self.worker_group.world_size
        chosen, rejected, sources = preference_pairs(uids, sequences, rewards, self.config.min_reward_gap, workers)
        if not chosen:
            self.idle_steps += 1
            message = idle_message(self.config, step, len(set(uids)), len(sources), workers)
            limit = self.config.max_idle_steps
            if limit and self.idle_steps >= limit:
                raise RewardModelIdleError(f"{message}. That is {self.idle_steps} step(s) in a row, "
                                           f"online_rm.max_idle_steps={limit}: stopping the run (0 never stops)")
            logger.warning("%s (%d step(s) in a row; the run stops at online_rm.max_idle_steps=%d)", message,
                           self.idle_steps, limit)
            return {"rm/pairs": 0.0, "rm/trained": 0.0, "rm/idle_steps": float(self.idle_steps)}
        self.idle_steps = 0
        ranks = self.worker_group.train_rm_step(chosen, rejected)
        metrics = {k: mean_of(v) for k, v in ranks[0].items()}
        # what each rank holds (sharded: about a 1/ranks share of the whole), the largest and all together
        metrics["rm/state_bytes"] = max(r["rm/state_bytes"] for r in ranks)
        metrics["rm/state_bytes_all_ranks"] = sum(r["rm/state_bytes"] for r in ranks)
        by_source = {f"rm/pairs_from/{key}": float(sources.count(i)) for i, key in enumerate(self.config.reward_key)}
        return {**metrics, **by_source, "rm/pairs": float(len(chosen)), "rm/trained": 1.0, "rm/idle_steps": 0.0,
                "rm/ranks": float(workers)}

    def close(self) -> None:
        """Stop the RM's workers and give back the Ray resources of a pool of its own (the actor's pool stays).

        Returns once every worker is gone, sockets closed: a worker group started next (its master port is
        any free port) never meets this one's half-closed connections."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for worker in self.worker_group.workers:
            ray.kill(worker)
        for worker in self.worker_group.workers:
            try:
                ray.get(worker.__ray_ready__.remote())  # fails once the actor is dead
            except ray.exceptions.RayActorError:
                pass
        if self.own_pool is not None:
            for group in self.own_pool.pgs or []:
                remove_placement_group(group)

    def save_checkpoint(self, path: str) -> None:
        """Write the RM's training state (trainable weights, optimizer, step count) under ``path``."""
        self.worker_group.save_rm_checkpoint(path)

    def resume(self, path: str | None) -> dict[str, float]:
        """Restore :meth:`save_checkpoint`'s state from ``path`` (``None``: the initial RM) and publish it."""
        return self.worker_group.load_rm_checkpoint(path)[0]
