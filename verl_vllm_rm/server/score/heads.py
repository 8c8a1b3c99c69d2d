"""What to ask the engine for each served head, and how its answer becomes a reward (pure torch).

vLLM answers a pooling request with a tensor: ``classify`` gives the head's outputs at the last token
(``[labels]``), ``token_classify`` one row per prompt token (``[tokens, labels]``, the ALL pooler) or per step
tag (``[steps, labels]``, the STEP pooler). One rule for every head that gives a reward, outcome or step: it is a
logit (raw), or with ``normalize`` its sigmoid, a probability. A two-label head's logit is its margin
(good - bad; sigmoid(margin) = softmax(...)[good]), so every family feeds the same step reductions and whitening.
Which request and which column, per head (:class:`~verl_vllm_rm.protocol.model_shape.HeadKind`):

- ``scalar`` sequence classifier: ``classify``; read at step tags too, its ``token_classify`` rows there are the
  steps' scores.
- ``scalar`` native RM (Qwen2ForRewardModel, InternLM2ForRewardModel): ``token_classify``, the last row.
- ``attributes``: ``classify`` raw, always: one value per attribute (vLLM's default softmax would couple them;
  regression outputs have no sigmoid meaning).
- ``two_class``: ``classify`` raw logits [bad, good]: the margin good - bad.
- ``step_classifier`` (Qwen2.5-Math-PRM): ``token_classify`` raw at each step tag, [negative, positive]: the
  margin positive - negative (``normalize``: P(positive), the published step score).
- ``step_tokens`` (Math-Shepherd): ``token_classify`` raw over the logits of the (good, bad) tokens at each step
  tag: the margin good - bad (``normalize``: P(good) over the two, the published step score).

The activation is applied here, not by vLLM, so that a raw and a normalized answer come from the same logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape

@dataclass(frozen=True)
class HeadReading:
    """One sequence's reward: the outcome ``score`` (None for attributes and step-only heads), the attribute
    values, and the step scores (None when the head is not read at steps; empty when the sequence has no step)."""

    score: float | None
    attributes: list[float] | None = None
    step_scores: list[float] | None = None


def engine_tasks(shape: ModelShape) -> tuple[str, ...]:
    """vLLM's pooling tasks one sequence needs, each asked raw (:func:`read_head` activates), in the order it reads
    their answers."""
    if shape.per_token:
        return ("token_classify",)
    return ("classify", "token_classify") if shape.reads_steps else ("classify",)


def _rows(data: torch.Tensor, width: int) -> torch.Tensor:
    """A ``token_classify`` answer as ``[rows, width]`` (an empty one, a sequence without a step, as ``[0, width]``)."""
    return data.reshape(-1, width).to(torch.float32) if data.numel() else data.new_zeros((0, width), dtype=torch.float32)


def _margin(rows: torch.Tensor, good: int) -> torch.Tensor:
    """good - other of two-column logits."""
    return rows[:, good] - rows[:, 1 - good]


def read_head(shape: ModelShape, outputs: Sequence[torch.Tensor], normalize: bool) -> HeadReading:
    """The reward of one sequence from the raw answers to :func:`engine_tasks` (same order)."""
    kind, width = shape.kind, len(shape.labels)
    activate = torch.sigmoid if normalize else (lambda x: x)
    if kind is HeadKind.ATTRIBUTES:
        return HeadReading(None, attributes=outputs[0].reshape(-1).to(torch.float32).tolist())
    if kind in (HeadKind.STEP_CLASSIFIER, HeadKind.STEP_TOKENS):
        good = 1 if kind is HeadKind.STEP_CLASSIFIER else 0  # [negative, positive] / [good, bad]
        return HeadReading(None, step_scores=activate(_margin(_rows(outputs[0], width), good)).tolist())
    if kind is HeadKind.TWO_CLASS:
        return HeadReading(float(activate(_margin(_rows(outputs[0], width), 1))[0]))
    if shape.per_token:  # a native scalar RM: its value at the last token
        return HeadReading(float(activate(_rows(outputs[0], 1)[-1, 0])))
    steps = activate(_rows(outputs[1], 1)[:, 0]).tolist() if shape.reads_steps else None
    return HeadReading(float(activate(outputs[0].reshape(-1)[0].to(torch.float32))), step_scores=steps)
