"""Bradley-Terry pairwise training of a scalar reward model (head-only, LoRA or full).

The loss is ``-log sigmoid(r(chosen) - r(rejected))``: the model learns to score
the preferred response higher. ``prepare_reward_model`` decides what trains
(the head; LoRA adapters plus the head; everything), which is also what a
publish must send (``RewardModelTrainingMode``). Plain torch/transformers/peft:
the verl worker in :mod:`verl_vllm_rm.online.worker` wraps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from verl_vllm_rm.protocol.names import DEFAULT_HEAD_PATTERNS, RewardModelTrainingMode, is_head


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


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    return -F.logsigmoid(chosen - rejected).mean()


def prepare_reward_model(
    model: torch.nn.Module,
    mode: RewardModelTrainingMode | str,
    *,
    lora_rank: int = 8,
    lora_alpha: int = 16,
    lora_target_modules: Sequence[str] | str = "all-linear",
    head_patterns: Sequence[str] = DEFAULT_HEAD_PATTERNS,
) -> torch.nn.Module:
    """Make exactly the parts ``mode`` trains require grad (LoRA wraps the model with peft)."""
    mode = RewardModelTrainingMode.parse(mode)
    if mode is RewardModelTrainingMode.LORA:
        from peft import LoraConfig, get_peft_model

        targets = lora_target_modules if isinstance(lora_target_modules, str) else list(lora_target_modules)
        config = LoraConfig(
            task_type="SEQ_CLS", r=lora_rank, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets
        )
        return get_peft_model(model, config)
    for name, param in model.named_parameters():
        param.requires_grad_(mode is RewardModelTrainingMode.FULL or is_head(name, head_patterns))
    return model


class BradleyTerryTrainer:
    """One optimizer over the trainable parameters; ``step`` runs one BT update.

    With ``grad_group`` (ranks holding replicas of the model) the replicas start
    from rank 0's trainable parameters (a fresh LoRA adapter is random on every
    rank) and gradients are averaged across it before each update, so every
    replica stays identical.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        max_grad_norm: float = 1.0,
        grad_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the reward model has no trainable parameter; call prepare_reward_model first")
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
        self.max_grad_norm = max_grad_norm
        self.grad_group = grad_group
        self.steps = 0
        if self._replicas() > 1:
            src = dist.get_global_rank(grad_group, 0)
            with torch.no_grad():
                for p in self.params:
                    dist.broadcast(p.data, src=src, group=grad_group)

    def _replicas(self) -> int:
        return dist.get_world_size(self.grad_group) if self.grad_group is not None else 1

    def step(self, batch: PreferenceBatch) -> dict[str, float]:
        self.model.train()
        chosen = sequence_rewards(self.model, batch.chosen_ids, batch.chosen_mask)
        rejected = sequence_rewards(self.model, batch.rejected_ids, batch.rejected_mask)
        loss = bradley_terry_loss(chosen, rejected)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if (world := self._replicas()) > 1:
            for p in self.params:  # gloo has no AVG: sum, then divide
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.grad_group)
                    p.grad.div_(world)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        self.model.eval()
        self.steps += 1
        margin = (chosen - rejected).detach()
        return {
            "rm/bt_loss": float(loss.detach()),
            "rm/pair_accuracy": float((margin > 0).float().mean()),
            "rm/margin": float(margin.mean()),
            "rm/grad_norm": float(grad_norm),
            "rm/pairs": float(len(batch)),
        }

    def state_dict(self) -> dict[str, Any]:
        """What resumes training: the trainable parameters (by name, on CPU), the optimizer, the step count."""
        params = {n: p.detach().cpu() for n, p in self.model.named_parameters() if p.requires_grad}
        return {"params": params, "optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output into this (identically prepared) model and optimizer."""
        trainable = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        missing, unexpected = sorted(trainable.keys() - state["params"]), sorted(state["params"].keys() - trainable)
        if missing or unexpected:
            raise ValueError(f"the RM checkpoint does not match this model's trainable parameters (missing "
                             f"{missing[:3]}, unexpected {unexpected[:3]}, {len(missing)}/{len(unexpected)} in all): "
                             "resume with the training_mode and LoRA options it was saved with")
        with torch.no_grad():
            for name, param in trainable.items():
                param.copy_(state["params"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
