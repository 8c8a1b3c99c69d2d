"""Build a GRPO-shaped verl ``DataProto`` (prompts x responses) from token ids.

The layout is the one verl's rollout produces: prompts left-padded to a common
length, responses right-padded, one attention mask over both, a ``uid`` shared by
the responses of one prompt. Used by the demo, the benchmarks and the tests.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class Group:
    prompt_ids: list[int]
    response_ids: list[list[int]]
    ground_truth: str = ""
    data_source: str = "vllm_rm/demo"
    raw_prompt: list[dict] | None = None
    extra_info: dict = field(default_factory=dict)


def build_batch(groups: Sequence[Group], pad_id: int, prompt_len: int | None = None, response_len: int | None = None):
    """A ``DataProto`` with ``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``."""
    import numpy as np
    import torch

    from verl import DataProto

    rows = [(g, r) for g in groups for r in g.response_ids]
    p_len = prompt_len or max(len(g.prompt_ids) for g in groups)
    r_len = response_len or max(max(len(r) for r in g.response_ids) for g in groups)
    n = len(rows)
    prompts = torch.full((n, p_len), pad_id, dtype=torch.long)
    responses = torch.full((n, r_len), pad_id, dtype=torch.long)
    mask = torch.zeros((n, p_len + r_len), dtype=torch.long)
    for i, (g, r) in enumerate(rows):
        if len(g.prompt_ids) > p_len or len(r) > r_len:
            raise ValueError(f"row {i}: prompt/response of {len(g.prompt_ids)}/{len(r)} tokens is longer than "
                             f"prompt_len={p_len}/response_len={r_len}: raise them, or leave them None (the longest "
                             "prompt and response)")
        prompts[i, p_len - len(g.prompt_ids):] = torch.tensor(g.prompt_ids)
        mask[i, p_len - len(g.prompt_ids): p_len] = 1
        if r:
            responses[i, : len(r)] = torch.tensor(r)
            mask[i, p_len: p_len + len(r)] = 1
    uids = {id(g): str(uuid.uuid4()) for g in groups}
    non_tensors: dict[str, Any] = {
        "uid": np.array([uids[id(g)] for g, _ in rows], dtype=object),
        "data_source": np.array([g.data_source for g, _ in rows], dtype=object),
        "reward_model": np.array([{"ground_truth": g.ground_truth, "style": "rule"} for g, _ in rows], dtype=object),
        "extra_info": np.array([dict(g.extra_info) for g, _ in rows], dtype=object),
    }
    if all(g.raw_prompt is not None for g in groups):
        raw = np.empty(n, dtype=object)  # a 1-D array of message lists, as verl's dataset yields
        raw[:] = [list(g.raw_prompt) for g, _ in rows]
        non_tensors["raw_prompt"] = raw
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(dim=1) - 1).clamp(min=0),
        },
        non_tensors=non_tensors,
    )


def last_token_rewards(reward_tensor, data):
    """Each row's value at its last valid response token, where a sequence score lands in verl."""
    import torch

    last = data.batch["attention_mask"][:, data.batch["prompts"].shape[1]:].sum(1) - 1
    return reward_tensor[torch.arange(len(data)), last]


def row_token_ids(group: Group, response: list[int]) -> list[int]:
    """What the manager sends for one row in ``token_ids`` mode (no truncation)."""
    return list(group.prompt_ids) + list(response)
