"""What trains in each mode: the head (``head_only``), LoRA adapters plus the head (``lora``), everything (``full``).

The one definition, used by the RM engine (:mod:`verl_vllm_rm.online.engine`) and by the
single-process trainer of the dev tools (:mod:`verl_vllm_rm.dev.offline_bt`); a publish sends
exactly what it makes trainable (:mod:`verl_vllm_rm.weight_sync.selection`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from verl_vllm_rm.protocol.names import DEFAULT_HEAD_PATTERNS, RewardModelTrainingMode, is_head


def head_module_names(model: torch.nn.Module, head_patterns: Sequence[str] = DEFAULT_HEAD_PATTERNS) -> list[str]:
    """The modules holding the scalar head (``score`` in Qwen2/Llama classifiers)."""
    return sorted({name.rsplit(".", 1)[0] for name, _ in model.named_parameters() if is_head(name, head_patterns)})


def freeze_all_but_head(model: torch.nn.Module, head_patterns: Sequence[str] = DEFAULT_HEAD_PATTERNS) -> None:
    """``head_only``: only the head's parameters require grad."""
    heads = 0
    for name, param in model.named_parameters():
        param.requires_grad_(is_head(name, head_patterns))
        heads += is_head(name, head_patterns)
    if not heads:
        raise ValueError(f"head_only training found no head parameter matching {list(head_patterns)} in "
                         f"{type(model).__name__}: use training_mode=lora or full, or a classifier whose head "
                         "is named score.* or classifier.*")


def lora_config(model: torch.nn.Module, rank: int, alpha: int, target_modules: Any = "all-linear",
                exclude_modules: Any = None, head_patterns: Sequence[str] = DEFAULT_HEAD_PATTERNS):
    """LoRA on ``target_modules``, the head trained in full beside it (``modules_to_save``), never adapted."""
    from peft import LoraConfig

    heads = head_module_names(model, head_patterns)
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    excluded = [*heads, *([exclude_modules] if isinstance(exclude_modules, str) else list(exclude_modules or ()))]
    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets,
                      exclude_modules=excluded, modules_to_save=heads, bias="none")


def prepare_reward_model(model: torch.nn.Module, mode: RewardModelTrainingMode | str, *, lora_rank: int = 8,
                         lora_alpha: int = 16, lora_target_modules: Any = "all-linear",
                         head_patterns: Sequence[str] = DEFAULT_HEAD_PATTERNS) -> torch.nn.Module:
    """Make exactly the parts ``mode`` trains require grad (LoRA wraps the model with peft)."""
    mode = RewardModelTrainingMode.parse(mode)
    if mode is RewardModelTrainingMode.LORA:
        from peft import get_peft_model

        return get_peft_model(model, lora_config(model, lora_rank, lora_alpha, lora_target_modules,
                                                 head_patterns=head_patterns))
    if mode is RewardModelTrainingMode.HEAD_ONLY:
        freeze_all_but_head(model, head_patterns)
    else:
        model.requires_grad_(True)
    return model
