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


def _set_validating(worker: Any, validating: bool) -> None:
    manager_of(worker).validating = validating


def mark_validation(workers: Sequence[Any], validating: bool) -> None:
    """Tell every worker's manager that verl's validation starts (or ended): verl 0.9.1's agent loop calls
    reward managers once per trajectory without its ``validate`` flag, so only the trainer knows. Its samples
    then use ``val_kwargs.n`` groups, compare with the reference under ``pairwise=auto`` and leave the
    whitening statistics alone."""
    on_every_worker(workers, _set_validating, validating)
