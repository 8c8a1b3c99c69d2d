"""A probe of verl's reward calls (not a workaround): with :data:`REWARD_CALL_LOG_ENV` set, each call of
``RewardLoopWorker.compute_score`` (one trajectory, scored by verl's agent loop once the trajectory is done) appends
its trajectory to that JSONL file once the call ends: ``uid``, ``data_source``, prompt and response ids, whether it
validates, and what the call gave (its ``reward_extra_info``), or its error.

verl's asynchronous trainers abort generation in flight for a weight sync and resume it (partial rollouts); the
tests compare this log with the rollout's generation log to prove each trajectory was scored once, whole: never
twice, never on the prefix generated before an abort. The answers are those of every trajectory scored, trained on
or not: an asynchronous trainer also scores groups that no step takes, and the rollout dump has only those taken.
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
    uid, source = sample.fields.get("uid"), sample.fields.get("data_source")
    return {"uid": None if uid is None else str(uid), "data_source": None if source is None else str(source),
            "prompt_ids": sample.prompt_ids.tolist(),
            "response_ids": sample.response_ids.tolist(), "validate": sample.validate}


def plain(value: Any) -> Any:
    """A numpy value of an answer as JSON has it (a scalar's number, an array's list); anything else as text."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


def log_reward_calls() -> None:
    """Wrap ``RewardLoopWorker.compute_score`` (once) to append each call's trajectory to the log, when one is set."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    original = RewardLoopWorker.compute_score
    if getattr(original, "logs_reward_calls", False):
        return

    @functools.wraps(original)
    async def compute_score(self, data):
        path = os.environ.get(REWARD_CALL_LOG_ENV)
        if not path:
            return await original(self, data)
        record = reward_call_record(data)
        try:
            result = await original(self, data)
            record["reward_extra_info"] = result.get("reward_extra_info") or {}
            return result
        except BaseException as e:  # logged as the call's end, and raised on
            record["error"] = f"{type(e).__name__}: {e}"
            raise
        finally:
            with open(path, "a") as f:
                f.write(json.dumps(record, default=plain) + "\n")

    compute_score.logs_reward_calls = True
    RewardLoopWorker.compute_score = compute_score


def reward_calls_loggable() -> bool:
    """verl still scores one trajectory per ``RewardLoopWorker.compute_score`` call."""
    import inspect

    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    return "data" in inspect.signature(RewardLoopWorker.compute_score).parameters
