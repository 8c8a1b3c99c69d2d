"""verl's critic engine holding a reward model: the one RM trainer (FSDP/FSDP2, bf16 compute, fp32 masters).

verl 0.9.1 trains a scalar-head model as its critic: ``FSDPEngineWithValueHead``
loads the checkpoint as ``*ForTokenClassification`` (a value at every token) and
gives sharding, mixed precision, micro-batching, gradient checkpointing, offload and
checkpoints. :class:`RewardModelEngine` is that engine with the three things it cannot
express for an RM, and nothing else (in the two builders verl's ``_build_model_optimizer`` calls):

- **loading.** verl's ``load_valuehead_model`` (``verl/utils/model.py``) hard-codes
  ``attn_implementation="flash_attention_2"`` and reports nothing about which weights
  loaded. Here the attention comes from ``override_config.attn_implementation`` (the
  option resolved by ``online.config.resolve_attention``), and a head or backbone weight
  that did not load is an error: an RM whose head silently starts from random weights
  would train and publish noise. The token
  classifier's ``score.bias``, which an RM's sequence classifier does not have, is
  removed, so the value at the last token is the RM's score exactly. A two-class head ([bad, good]) keeps its
  two rows and gives their margin (:class:`~verl_vllm_rm.online.trainable.MarginHead`), the reward the server
  reads from it: Bradley-Terry trains the margin, and a publish sends the head as the server holds it.
- **head_only.** verl has no option to train only the head: every other parameter is frozen.
- **LoRA.** verl's adapter is a causal-LM one with the head frozen; here the head trains
  in full beside the adapters (``modules_to_save``), as the server's merged update expects.
"""

from __future__ import annotations

import warnings

import torch
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead

from verl_vllm_rm.online.trainable import freeze_all_but_head, is_two_class_head, lora_config, read_two_class_margin
from verl_vllm_rm.protocol.names import DEFAULT_HEAD_PATTERNS, RewardModelTrainingMode, is_head

MODEL_TYPE = "reward_model"  # the TrainingWorkerConfig.model_type that selects this engine


class HeadNotLoadedError(ValueError):
    """The RM checkpoint's weights did not all load into verl's value model."""


def drop_missing_biases(module: torch.nn.Module, missing: list[str]) -> list[str]:
    """Remove the Linear biases the checkpoint lacks (the token classifier's head has one; the RM's has not);
    the missing names that remain."""
    left = set(missing)
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.Linear) and sub.bias is not None and f"{name}.bias" in left:
            sub.register_parameter("bias", None)
            left.discard(f"{name}.bias")
    return sorted(left)


@EngineRegistry.register(model_type=MODEL_TYPE, backend=["fsdp", "fsdp2"], device=["cuda", "npu"])
class RewardModelEngine(FSDPEngineWithValueHead):
    """verl's value-head engine for an RM; the worker sets ``training_mode`` before ``initialize()``."""

    training_mode: RewardModelTrainingMode = RewardModelTrainingMode.FULL
    head_patterns: tuple[str, ...] = DEFAULT_HEAD_PATTERNS

    def _build_module(self) -> torch.nn.Module:
        from transformers import AutoModelForTokenClassification
        from verl.models.transformers.monkey_patch import apply_monkey_patch
        from verl.utils.fsdp_utils import get_init_weight_context_manager
        from verl.utils.torch_dtypes import PrecisionType

        cfg, hf_config = self.model_config, self.model_config.hf_config
        two_class = is_two_class_head(hf_config.to_dict())
        if not two_class:
            hf_config.num_labels = 1  # as verl's critic
        hf_config.classifier_dropout = 0.0
        dtype = PrecisionType.to_dtype(self.engine_config.model_dtype or "fp32")  # the master weights
        init_context = get_init_weight_context_manager(use_meta_tensor=not hf_config.tie_word_embeddings,
                                                       mesh=self.device_mesh)
        with init_context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module, info = AutoModelForTokenClassification.from_pretrained(
                cfg.local_path, torch_dtype=dtype, config=hf_config, trust_remote_code=cfg.trust_remote_code,
                attn_implementation=cfg.override_config["attn_implementation"],
                output_loading_info=True)
        missing = drop_missing_biases(module, list(info["missing_keys"]))
        if missing:
            heads = [n for n in missing if is_head(n, self.head_patterns)]
            raise HeadNotLoadedError(
                f"{len(missing)} weight(s) of the RM at {cfg.local_path} did not load into verl's value model "
                f"({type(module).__name__}): {missing[:4]}{' (the head)' if heads else ''}. verl loads an RM as "
                "*ForTokenClassification: use a *ForSequenceClassification checkpoint whose head is named like "
                f"that architecture's token-classification head (heads: {list(self.head_patterns)})")
        apply_monkey_patch(model=module, use_remove_padding=self.use_remove_padding,
                           ulysses_sp_size=self.ulysses_sequence_parallel_size, use_fused_kernels=False)
        module.to(dtype)
        if two_class:
            read_two_class_margin(module, self.head_patterns)
        if cfg.enable_gradient_checkpointing:
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.training_mode is RewardModelTrainingMode.HEAD_ONLY:
            freeze_all_but_head(module, self.head_patterns)
        return module

    def _build_lora_module(self, module: torch.nn.Module) -> torch.nn.Module:
        from peft import get_peft_model

        cfg = self.model_config
        module.enable_input_require_grads()
        return get_peft_model(module, lora_config(module, cfg.lora_rank, cfg.lora_alpha, cfg.target_modules,
                                                  cfg.exclude_modules, self.head_patterns))
