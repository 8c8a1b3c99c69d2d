"""``step_reward=token`` in verl's agent loop: each training trajectory's per-token rewards into ``rm_scores``.

verl's agent loop keeps one scalar per trajectory, at its last token (``AgentLoopOutput.as_dict``). The reward
manager gives that scalar (the composed total) and, in ``reward_extra_info``'s ``token_rewards``, the same total
spread over the response: each step's reward on the policy token that ends the step, the rest on the last token.
Before verl computes the advantage from ``rm_scores``, the trainer modes write those lists over the scalars, in
TransferQueue. Both sum to the same total, so verl's score metrics and its rollout dump's ``score`` are unchanged.

A trajectory whose ``rm_scores`` is not as long as its list keeps verl's scalar: verl copies the final output's
``reward_extra_info`` to every earlier output of a multi-output agent loop, and those are other token sequences.
``reward/token_rewards_placed`` reports the share placed.
"""

from __future__ import annotations

from typing import Any

import torch
import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.utils import tensordict_utils as tu

from verl_vllm_rm.extra_info import TOKEN_REWARDS

PLACED_METRIC = "reward/token_rewards_placed"


def token_rewards_of(row: Any) -> list[float] | None:
    """A trajectory's ``token_rewards`` from its TransferQueue ``extra_fields`` row (None: none)."""
    fields = getattr(row, "data", row)
    info = fields.get("reward_extra_info", {}) if isinstance(fields, dict) else {}
    value = info.get(TOKEN_REWARDS)
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (list, tuple)):
        value = value[0]  # a backend that wraps each value in a one-element list
    return None if value is None else [float(v) for v in value]


def place_token_rewards(batch: KVBatchMeta) -> dict[str, float]:
    """Write each trajectory's ``token_rewards`` into its ``rm_scores`` (one TransferQueue read, one write of the
    rows placed); the metric of the share placed, empty when no trajectory has token rewards."""
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["rm_scores",
                                                                                           "extra_fields"])
    scores = list(data["rm_scores"].unbind())
    wanted, placed = 0, []
    for i, row in enumerate(data["extra_fields"]):
        tokens = token_rewards_of(row)
        if tokens is None:
            continue
        wanted += 1
        if len(tokens) == scores[i].numel():
            scores[i] = torch.tensor(tokens, dtype=scores[i].dtype)
            placed.append(i)
    if placed:
        nested = torch.nested.as_nested_tensor([scores[i] for i in placed], layout=torch.jagged)
        tq.kv_batch_put(keys=[batch.keys[i] for i in placed], partition_id=batch.partition_id,
                        fields=tu.get_tensordict({"rm_scores": nested}))
    return {PLACED_METRIC: len(placed) / wanted} if wanted else {}


def placed_rewards(partition_id: str, keys: list[str]) -> list[list[float]]:
    """The ``rm_scores`` verl trained on for these trajectories, one list per key (for the rollout dump)."""
    data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["rm_scores"])
    return [row.tolist() for row in data["rm_scores"].unbind()]
