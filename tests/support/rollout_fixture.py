"""The rollout the RM trainer tests share (the ``rollout`` fixture; a plugin of tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl_vllm_rm.rows import unpadded


@pytest.fixture(scope="module")
def rollout(tokenizer):
    """4 prompts x 4 responses in verl's layout (left-padded prompts, right-padded responses),
    with a verifiable reward: 1 for the right sum, 0 otherwise."""
    pad = tokenizer.pad_token_id
    rows, uids, rewards = [], [], []
    for g, (a, b) in enumerate([(3, 4), (12, 30), (7, 8), (40, 2)]):
        prompt = tokenizer(f"What is {a} + {b}?").input_ids
        for k, answer in enumerate([a + b + 1, a + b, a * b, a + b]):
            rows.append((prompt, tokenizer(f" <think>{'add ' * k}</think> The answer is {answer}.").input_ids))
            uids.append(f"group-{g}")
            rewards.append(float(answer == a + b))
    p_len, r_len = max(len(p) for p, _ in rows), max(len(r) for _, r in rows)
    prompts = torch.full((len(rows), p_len), pad)
    responses = torch.full((len(rows), r_len), pad)
    mask = torch.zeros((len(rows), p_len + r_len), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        prompts[i, p_len - len(p):], responses[i, : len(r)] = torch.tensor(p), torch.tensor(r)
        mask[i, p_len - len(p): p_len + len(r)] = 1
    sequences = [np.concatenate(row).tolist() for row in zip(*unpadded(prompts, responses, mask))]
    return uids, sequences, rewards, [p + r for p, r in rows]
