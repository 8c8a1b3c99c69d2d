"""Load ``vllm_rm`` the way a verl run does, outside a run.

verl's own ``ppo_trainer`` config (its Hydra defaults) composed with the overrides
a user would pass to ``main_ppo``, then verl's ``load_reward_manager``: examples,
benchmarks and tests get exactly the manager a training run builds.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig


def compose_verl_config(overrides: Sequence[str] = ()) -> DictConfig:
    """verl's ``ppo_trainer`` config with Hydra ``overrides`` (``key=value``, ``+key=value``)."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar; strings pass as they are (quote them yourself if they need it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    return str(value)


def vllm_rm_overrides(server_url: str | None, model_path: str, reward_kwargs: Mapping[str, Any] | None = None
                      ) -> list[str]:
    """The overrides that select ``vllm_rm`` on ``server_url`` (None: the options say where, e.g. ``replicas``)
    with ``reward.reward_kwargs``."""
    kwargs = {**({"server_url": server_url} if server_url else {}), **(reward_kwargs or {})}
    return [
        "reward.reward_manager.name=vllm_rm",
        f"actor_rollout_ref.model.path={model_path}",
        *[f"+reward.reward_kwargs.{key}={hydra_value(value)}" for key, value in kwargs.items()],
    ]


def vllm_rm_config(server_url: str | None, model_path: str, reward_kwargs: Mapping[str, Any] | None = None,
                   overrides: Sequence[str] = ()) -> DictConfig:
    """A composed verl config selecting ``vllm_rm``; ``overrides`` are further Hydra overrides."""
    return compose_verl_config([*vllm_rm_overrides(server_url, model_path, reward_kwargs), *overrides])


def load_manager(tokenizer: Any, server_url: str, model_path: str, reward_kwargs: Mapping[str, Any] | None = None,
                 overrides: Sequence[str] = ()) -> Any:
    """The ``VLLMRewardManager`` verl's ``load_reward_manager`` builds from that config."""
    from verl.trainer.ppo.reward import load_reward_manager

    return load_reward_manager(vllm_rm_config(server_url, model_path, reward_kwargs, overrides), tokenizer)
