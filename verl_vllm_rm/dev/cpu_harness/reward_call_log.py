"""A probe of verl's reward calls (not a workaround): with :data:`REWARD_CALL_LOG_ENV` set, each call of
``RewardLoopWorker.compute_score`` (one trajectory, scored by verl's agent loop once the trajectory is done) appends
its trajectory to that JSONL file: ``uid``, prompt and response ids, whether it validates.

verl's asynchronous trainers abort generation in flight for a weight sync and resume it (partial rollouts); the
tests compare this log with the rollout's generation log to prove each trajectory was scored once, whole: never
twice, never on the prefix generated before an abort.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from verl_vllm_rm.dev.cpu_names import REWARD_CALL_LOG_ENV
from verl_vllm_rm.rows import samples_of


def reward_call_record(data: Any) -> dict[str, Any]:
    """The trajectory of one reward call's one-row ``DataProto``."""
    (sample,) = samples_of([data])
    uid = sample.fields.get("uid")
    return {"uid": None if uid is None else str(uid), "prompt_ids": sample.prompt_ids.tolist(),
            "response_ids": sample.response_ids.tolist(), "validate": sample.validate}


def log_reward_calls() -> None:
    """Wrap ``RewardLoopWorker.compute_score`` (once) to append each call's trajectory to the log, when one is set."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    original = RewardLoopWorker.compute_score
    if getattr(original, "logs_reward_calls", False):
        return

    @functools.wraps(original)
    async def compute_score(self, data):
        path = os.environ.get(REWARD_CALL_LOG_ENV)
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(reward_call_record(data)) + "\n")
        return await original(self, data)

    compute_score.logs_reward_calls = True
    RewardLoopWorker.compute_score = compute_score


def reward_calls_loggable() -> bool:
    """verl still scores one trajectory per ``RewardLoopWorker.compute_score`` call."""
    import inspect

    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    return "data" in inspect.signature(RewardLoopWorker.compute_score).parameters
