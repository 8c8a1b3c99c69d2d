"""What trains in each mode: the head (``head_only``), LoRA adapters plus the head (``lora``), everything (``full``).

The one definition, used by the RM engine (:mod:`verl_vllm_rm.online.engine`) and by the
single-process trainer of the dev tools (:mod:`verl_vllm_rm.dev.offline_bt`); a publish sends
exactly what it makes trainable (:mod:`verl_vllm_rm.weight_sync.selection`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.protocol.model_shape import HeadKind, auto_head_kind
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


def head_outputs(config: Mapping[str, Any]) -> int:
    """How many outputs the head a ``config.json`` (or ``PretrainedConfig.to_dict()``) describes has."""
    return len(config.get("id2label") or {}) or int(config.get("num_labels", 1))


def is_two_class_head(config: Mapping[str, Any]) -> bool:
    """A two-class head ([bad, good]), as the server reads the config (:func:`auto_head_kind`)."""
    return auto_head_kind(head_outputs(config), config.get("problem_type")) is HeadKind.TWO_CLASS


class MarginHead(torch.nn.Linear):
    """A two-class head [bad, good] giving one value, its margin ``good - bad``: the reward the server reads
    from it (``sigmoid(margin)`` = P(good)). Its weights stay the two rows the server holds, so a publish and a
    checkpoint carry the head as loaded; Bradley-Terry on the margin moves both rows."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().forward(hidden)
        return logits[..., 1:] - logits[..., :1]


def read_two_class_margin(model: torch.nn.Module, head_patterns: Sequence[str] = DEFAULT_HEAD_PATTERNS) -> None:
    """Make the model's two-output head give its margin (in place; the head's parameters are untouched)."""
    heads = [model.get_submodule(name) for name in head_module_names(model, head_patterns)]
    linear = [h for h in heads if type(h) is torch.nn.Linear and h.out_features == 2]
    if len(linear) != 1:
        raise ValueError(f"a two-class RM's head is one Linear of 2 outputs; {type(model).__name__} has "
                         f"{[type(h).__name__ for h in heads]} matching {list(head_patterns)}: train a scalar or "
                         "two-class *ForSequenceClassification")
    linear[0].__class__ = MarginHead  # a Linear subclass with no state of its own: same parameters, new forward


def untrainable_head_reason(config: dict) -> str | None:
    """Why online training cannot train the head a ``config.json`` describes (None: a scalar or two-class
    classifier, it can).

    Online training fits a Bradley-Terry model to preference pairs on the reward at the last token (a two-class
    head's margin), through verl's engine loading the checkpoint with transformers."""
    architecture = (config.get("architectures") or ["an unnamed architecture"])[0]
    if architecture in ("Qwen2ForRewardModel", "InternLM2ForRewardModel", "Qwen2ForProcessRewardModel"):
        return (f"{architecture} has no transformers class (its modeling code ships with the published checkpoint), "
                "so verl's engine cannot load it to train")
    if not architecture.endswith("ForSequenceClassification"):
        return (f"{architecture} is not a sequence classifier (a process reward model read at step tags, or a "
                "causal LM): preference pairs rank whole responses by one reward")
    outputs = head_outputs(config)
    if auto_head_kind(outputs, config.get("problem_type")) is HeadKind.ATTRIBUTES:
        return (f"{architecture} has {outputs} attribute outputs and preference pairs train one reward; there is no "
                "single reward to train")
    return None


def check_trainable_head(model_path: str) -> None:
    """Refuse, at start-up, a reward model whose head online training cannot train, saying why. A path without a
    ``config.json`` is left to verl's loader, which names it."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return
    reason = untrainable_head_reason(json.loads(config_file.read_text()))
    if reason is not None:
        raise ConfigError(f"online_rm.model_path={model_path}: {reason}; online_rm trains a reward model with a "
                         "scalar or two-class head (*ForSequenceClassification, num_labels=1 or 2). Serve this one "
                         "without online training (drop trainer.v1.trainer_mode=vllm_rm_online), or train a scalar "
                         "RM")
