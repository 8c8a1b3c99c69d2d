"""A probe of the online RM step (not a workaround): with :data:`RM_STEP_LOG_ENV` set, each RM step of an online
trainer mode (``OnlineRewardModelTraining.train_reward_model``: the RM's training step, its publish and the drift
probe) appends ``{"step", "start", "end"}`` (wall-clock seconds) to that JSONL file.

The tests hold it against the rollout's generation log (each segment's ``start`` and ``end``): in verl's
asynchronous trainers generation goes on while the RM trains and publishes; only scoring waits, for the server's
reload.
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

from verl_vllm_rm.dev.cpu_names import RM_STEP_LOG_ENV


def log_rm_steps() -> None:
    """Wrap ``OnlineRewardModelTraining.train_reward_model`` (once) to append each RM step's window to the log,
    when one is set."""
    from verl_vllm_rm.plugin.online_mode import OnlineRewardModelTraining

    original = OnlineRewardModelTraining.train_reward_model
    if getattr(original, "logs_rm_steps", False):
        return

    @functools.wraps(original)
    def train_reward_model(self, data: dict[str, Any]) -> dict[str, float]:
        start = time.time()
        metrics = original(self, data)
        path = os.environ.get(RM_STEP_LOG_ENV)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"step": self.global_steps, "start": start, "end": time.time()}) + "\n")
        return metrics

    train_reward_model.logs_rm_steps = True
    OnlineRewardModelTraining.train_reward_model = train_reward_model
