"""A real TransferQueue holding one PPO step's trajectories, written field by field as verl's agent loop
writes them (``AgentLoopOutput.as_dict`` + ``list_of_dict_to_tensordict``): what verl's v1 trainer, trainer
mode ``vllm_rm`` and ``vllm_rm_online`` read after a step."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def queue(ray_cluster):
    import transfer_queue as tq

    tq.init()
    yield tq
    tq.close()


def put_trajectories(tq, groups: dict[str, list[tuple[list[int], list[int], float]]],
                     infos: dict[str, list[dict]]):
    """Write rollouts to the TransferQueue as verl's agent loop does; returns their KVBatchMeta.

    ``groups``: uid -> [(prompt ids, response ids, score)]; the token-level ``rm_scores`` carry 10x the
    score. ``infos``: uid -> each trajectory's ``reward_extra_info``.
    """
    from transfer_queue import KVBatchMeta
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields, tags = [], [], []
    for uid, rows in groups.items():
        for session, ((prompt, response, score), info) in enumerate(zip(rows, infos[uid], strict=True)):
            output = AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=[1] * len(response),
                                     reward_score=10 * score, metrics=AgentLoopMetrics(),
                                     extra_fields={"reward_extra_info": info})
            field = output.as_dict()
            field.update(uid=uid, session_id=session, global_steps=1)
            keys.append(f"{uid}_{session}_0")
            fields.append(field)
            tags.append({"status": "success", "seq_len": len(prompt) + len(response)})
    tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
    return KVBatchMeta(partition_id="train", keys=keys, tags=tags)
