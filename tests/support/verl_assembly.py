"""verl 0.9.1's own assembly of per-sample reward results into a step's batch, for tests: a real
``AgentLoopWorker`` (in this process; no rollout server: the reward results are handed to it as its reward call
would have set them) runs its ``_agent_loop_postprocess`` on each trajectory and ``_postprocess`` on the batch,
where the step's ``reward_extra_info`` columns are built from the first sample's keys (agent_loop.py around line
1108). ``RewardLoopManager.compute_rm_score`` (reward_loop.py around line 366) is the batch path's twin; tests call
it with real Ray workers."""

from __future__ import annotations

from typing import Any, Sequence


def agent_loop_worker(config: Any, reward_loop_worker_handles: list | None = None) -> Any:
    """verl's ``AgentLoopWorker`` on ``config`` (``actor_rollout_ref.rollout.name`` set), with no LLM client."""
    from omegaconf import open_dict

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    with open_dict(config):
        config.actor_rollout_ref.rollout.name = "vllm"
    return AgentLoopWorker(config, None, reward_loop_worker_handles=reward_loop_worker_handles)


def agent_loop_output(prompt_ids: Sequence[int], response_ids: Sequence[int], result: dict | None = None) -> Any:
    """An agent loop's output; ``result`` (``run_single``'s) set on it as ``_compute_score`` sets it."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    output = AgentLoopOutput(prompt_ids=list(prompt_ids), response_ids=list(response_ids),
                             response_mask=[1] * len(response_ids), num_turns=2, metrics=AgentLoopMetrics())
    if result is not None:
        output.reward_score = result["reward_score"]
        output.extra_fields["reward_extra_info"] = result["reward_extra_info"]
    return output


async def assembled_step(worker: Any, rows: Sequence[tuple[Sequence[int], Sequence[int]]],
                         results: Sequence[dict]) -> Any:
    """The step's ``DataProto`` verl builds from these trajectories (prompt ids, response ids) and their reward
    results: ``_agent_loop_postprocess`` each, then ``_postprocess`` (a ``KeyError`` where a later sample lacks a key
    of the first)."""
    outputs = [await worker._agent_loop_postprocess(agent_loop_output(p, r, result), validate=False,
                                                    raw_prompt=[{"role": "user", "content": "q"}])
               for (p, r), result in zip(rows, results)]
    return worker._postprocess(outputs)
