"""Detect configurations that verl 0.9.1 accepts but silently routes away from ``vllm_rm``."""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, Sequence

logger = logging.getLogger("verl_vllm_rm")

LEGACY_KEY = "reward_model.reward_manager"
RIGHT_KEY = "reward.reward_manager.name=vllm_rm"


def _say(message: str) -> None:
    logger.warning(message)
    warnings.warn(message, UserWarning, stacklevel=3)


def warn_legacy_argv(argv: Sequence[str] = sys.argv) -> bool:
    """A Hydra override ``reward_model.reward_manager=vllm_rm`` is ignored by ``main_ppo`` in verl 0.9.1."""
    hits = [a for a in argv if a.lstrip("+").startswith(LEGACY_KEY + "=")]
    if hits:
        _say(
            f"verl-vllm-rm: the override {hits[0]!r} uses the legacy key {LEGACY_KEY}, which "
            f"verl 0.9.1's main_ppo ignores (your run would use the 'naive' manager). Use {RIGHT_KEY}"
        )
    return bool(hits)


def warn_misrouted_config(config: Any) -> list[str]:
    """Warnings for a config handed to our manager; returns the messages."""
    messages = []
    legacy = (config.get("reward_model") or {}).get("reward_manager") if hasattr(config, "get") else None
    if legacy:
        messages.append(
            f"verl-vllm-rm: {LEGACY_KEY}={legacy} is a legacy key that verl 0.9.1's main_ppo ignores; "
            f"set {RIGHT_KEY} instead"
        )
    reward = config.get("reward") if hasattr(config, "get") else None
    if reward is not None and reward.get("reward_model", {}).get("enable") and not (
        reward.get("custom_reward_function", {}).get("path")
    ):
        messages.append(
            "verl-vllm-rm: reward.reward_model.enable=True without custom_reward_function.path makes verl score "
            "with its own RM path and never call vllm_rm; set reward.reward_model.enable=False "
            "(the vllm_rm server is the reward model)"
        )
    for m in messages:
        _say(m)
    return messages
