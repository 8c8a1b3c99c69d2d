"""A single-process Bradley-Terry trainer for the dev tools: pre-training the tiny RM of the demo, and tests
and examples that need a trained model to publish.

Online RM training in a verl run is :mod:`verl_vllm_rm.online` on verl's own engine (sharded,
mixed precision); this is plain torch on one process, with what trains chosen by the same
:func:`~verl_vllm_rm.online.trainable.prepare_reward_model`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PreferenceBatch:
    """Right-padded chosen and rejected sequences (prompt + response token ids)."""

    chosen_ids: torch.Tensor
    chosen_mask: torch.Tensor
    rejected_ids: torch.Tensor
    rejected_mask: torch.Tensor

    def __len__(self) -> int:
        return self.chosen_ids.shape[0]


def _pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


def collate_pairs(chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]], pad_id: int) -> PreferenceBatch:
    if len(chosen) != len(rejected) or not chosen:
        raise ValueError(f"need as many chosen as rejected sequences (>0), got {len(chosen)} and {len(rejected)}")
    return PreferenceBatch(*_pad(chosen, pad_id), *_pad(rejected, pad_id))


def sequence_rewards(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The scalar head at each sequence's last real token (right padding), shape ``[batch]``."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return logits.reshape(logits.shape[0], -1)[:, 0]


class OfflineBradleyTerry:
    """One AdamW optimizer over the trainable parameters; ``step`` runs one BT update on one process."""

    def __init__(self, model: torch.nn.Module, *, lr: float = 1e-3, max_grad_norm: float = 1.0) -> None:
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the reward model has no trainable parameter (all have requires_grad=False): call "
                             "prepare_reward_model(model, training_mode) first, which chooses what trains")
        self.optimizer = torch.optim.AdamW(self.params, lr=lr)
        self.max_grad_norm = max_grad_norm

    def step(self, batch: PreferenceBatch) -> dict[str, float]:
        self.model.train()
        chosen = sequence_rewards(self.model, batch.chosen_ids, batch.chosen_mask)
        rejected = sequence_rewards(self.model, batch.rejected_ids, batch.rejected_mask)
        margin = chosen - rejected
        loss = -F.logsigmoid(margin).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.model.eval()
        return {"rm/bt_loss": float(loss.detach()), "rm/pair_accuracy": float((margin.detach() > 0).float().mean())}
