"""Reference scores from the same reward model run in transformers (trainer side).

Used to prove the server scores exactly like the trainer's model: parity tests,
``verl-vllm-rm check`` and benchmarks. Each sequence runs alone (no padding), so
the reference has no batching effects of its own.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence


@lru_cache(maxsize=4)
def load_reward_model(path: str):
    """Load (once per path) a ``*ForSequenceClassification`` model in fp32 eval mode."""
    import torch
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()


def sequence_scores(model, token_ids: Sequence[Sequence[int]]) -> list[float]:
    """The scalar head at the last token of each sequence (the raw logit), on the model's own device: a
    sequence classifier's one value, or a token classifier's (verl's value model) value at the last token."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        return [float(model(torch.tensor([list(ids)], device=device)).logits.reshape(-1)[-1]) for ids in token_ids]


def step_scores(model, token_ids: Sequence[Sequence[int]], step_tag_id: int) -> list[list[float]]:
    """The scalar head applied at every position holding ``step_tag_id`` (process reward)."""
    import torch

    out = []
    with torch.no_grad():
        for ids in token_ids:
            ids_t = torch.tensor([list(ids)])
            hidden = model.model(ids_t).last_hidden_state[0]
            per_token = model.score(hidden)[:, 0]
            out.append([float(v) for v in per_token[ids_t[0] == step_tag_id]])
    return out
