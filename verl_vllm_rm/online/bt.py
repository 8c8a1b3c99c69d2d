"""The Bradley-Terry step on verl's engine: preference pairs as engine input, and the loss.

Pairs travel as one jagged batch of ``2k`` sequences, chosen and rejected interleaved
(``c0, r0, c1, r1, ...``), and verl keeps each pair in one micro-batch
(``force_group_size=2``). The loss is ``-log sigmoid(r(chosen) - r(rejected))`` on the
value at each sequence's last token, normalised over the global batch the way verl's own
losses are (``batch_num_tokens``, ``dp_size``), so gradient accumulation and the rank
count do not change the step.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from tensordict import TensorDict

PAIR_GROUP = 2  # a chosen and a rejected sequence: verl's force_group_size


def last_token_values(values: torch.Tensor) -> torch.Tensor:
    """The value at each sequence's last token of a jagged ``[batch, len]`` tensor, shape ``[batch]``."""
    return values.values()[values.offsets()[1:] - 1]


def pair_batch(chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]]) -> TensorDict:
    """The engine's input for ``len(chosen)`` pairs: jagged ``input_ids``/``position_ids`` (interleaved), and a
    ``loss_mask`` with one 1 per sequence (its last token), so verl's ``batch_num_tokens`` counts sequences."""
    if len(chosen) != len(rejected) or not chosen:
        raise ValueError(f"need as many chosen as rejected sequences (>0), got {len(chosen)} and {len(rejected)}")
    sequences = [torch.tensor(list(s), dtype=torch.long) for pair in zip(chosen, rejected) for s in pair]
    empty = [i // PAIR_GROUP for i, s in enumerate(sequences) if len(s) == 0]
    if empty:
        raise ValueError(f"preference pair(s) {sorted(set(empty))} hold an empty sequence: every chosen and rejected "
                         "sequence needs at least one token (the RM's score is its value at the last one)")
    masks = [torch.zeros(len(s), dtype=torch.long).index_fill_(0, torch.tensor([len(s) - 1]), 1) for s in sequences]

    def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    return TensorDict({"input_ids": jagged(sequences), "position_ids": jagged([torch.arange(len(s)) for s in sequences]),
                       "loss_mask": jagged(masks)}, batch_size=[len(sequences)])


def bradley_terry_loss(model_output: dict, data: TensorDict, dp_group=None) -> tuple[torch.Tensor, dict]:
    """verl's loss hook (``TrainingWorker.set_loss_fn``): this micro-batch's share of the global mean BT loss.

    verl averages gradients over data-parallel ranks, hence the ``dp_size`` factor; ``batch_num_tokens`` is
    the global count of sequences (one loss-mask token each), twice the global pair count.
    """
    rewards = last_token_values(model_output["values"]).float()
    margin = rewards[0::PAIR_GROUP] - rewards[1::PAIR_GROUP]
    global_pairs = data["batch_num_tokens"] / PAIR_GROUP
    loss = -F.logsigmoid(margin).sum() / global_pairs * data["dp_size"]
    detached = margin.detach()
    return loss, {"rm/pair_accuracy": float((detached > 0).float().mean()), "rm/margin": float(detached.mean())}
