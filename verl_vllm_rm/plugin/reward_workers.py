"""What the trainer does inside verl's reward-loop workers (Ray actors, each holding one ``VLLMRewardManager``)."""

from __future__ import annotations

from typing import Any, Sequence

from verl_vllm_rm.options import ConfigError


def manager_of(worker: Any) -> Any:
    """The ``vllm_rm`` manager of one of verl's ``RewardLoopWorker`` actors (runs inside it)."""
    from verl_vllm_rm.scoring.manager import VLLMRewardManager

    manager = getattr(worker, "reward_manager", None)
    if not isinstance(manager, VLLMRewardManager):
        raise ConfigError(f"reward-loop worker {type(worker).__name__} holds {type(manager).__name__}, not "
                          "vllm_rm's manager (reward.reward_manager.name=vllm_rm)")
    return manager


def on_every_worker(workers: Sequence[Any], fn: Any, *args: Any) -> list:
    """``fn(worker, *args)`` inside each actor; ``__ray_call__`` runs a function on the actor instance, as verl's
    RewardLoopWorker has no method for this. (No workers, no Ray: ``ray.get`` would start a cluster.)"""
    if not workers:
        return []
    import ray

    return ray.get([w.__ray_call__.remote(fn, *args) for w in workers])
