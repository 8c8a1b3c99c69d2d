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
    """The reward at the last token of each sequence (raw), on the model's own device: a sequence classifier's
    one value, or a token classifier's (verl's value model) value at the last token; a two-class head's
    ([bad, good]) margin, as the server reads it."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        return [last_token_reward(model(torch.tensor([list(ids)], device=device)).logits) for ids in token_ids]


def last_token_reward(logits) -> float:
    """One value of a head's outputs at the last token: the value of a one-output head, good - bad of a two-class
    one. A head of more outputs has no single reward (its attributes are weighted by the run)."""
    last = logits.reshape(-1, logits.shape[-1])[-1]
    if len(last) == 1:
        return float(last[0])
    if len(last) == 2:
        return float(last[1] - last[0])
    raise ValueError(f"a head of {len(last)} outputs has no single reward to compare: parity reads a scalar or a "
                     "two-class ([bad, good]) head")


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
