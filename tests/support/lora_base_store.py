"""A small attention block's checkpoint and the server's LoRA base store of it, without vLLM: what the tests of
the store (tests/unit/server/weights/test_lora_bases.py) and of the merge from it (test_lora_merge.py) build on."""

from __future__ import annotations

import time

import torch

from verl_vllm_rm.server.weights.lora_bases import LoraBaseStore, PendingLoraBases, plan_lora_bases

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
ATTN = "model.layers.0.self_attn"
SHAPES = {f"{ATTN}.q_proj.weight": (8, 16), f"{ATTN}.q_proj.bias": (8,), f"{ATTN}.k_proj.weight": (4, 16),
          f"{ATTN}.k_proj.bias": (4,), f"{ATTN}.v_proj.weight": (4, 16), f"{ATTN}.v_proj.bias": (4,),
          f"{ATTN}.o_proj.weight": (16, 8)}


def attention_checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def plan_store(specs, max_bytes=None, model_dir: str = "not-a-local-dir", place: str = "host",
          loaded_at_ns: int | None = None):
    return plan_lora_bases(place, torch.device("cpu"), FUSED, specs, max_bytes, model_dir,
                           time.time_ns() if loaded_at_ns is None else loaded_at_ns)


def captured_store(dtype: torch.dtype = torch.float32) -> tuple[LoraBaseStore, dict[str, torch.Tensor]]:
    checkpoint = attention_checkpoint()
    pending = plan_store([(n, t.shape, dtype) for n, t in checkpoint.items()])
    assert isinstance(pending, PendingLoraBases)
    store = pending.capture(lambda: checkpoint.items())
    assert isinstance(store, LoraBaseStore)
    return store, checkpoint
