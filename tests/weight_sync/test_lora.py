"""The trainer-side LoRA merge matches peft's and leaves the trained model alone (no server)."""

from __future__ import annotations

import copy

import pytest
import torch
from sync_helpers import load_rm

from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.protocol.names import normalize_name
from verl_vllm_rm.weight_sync.lora import find_lora_modules, lora_scalings


def test_lora_merge_matches_peft_and_leaves_the_model_alone(tiny_rm):
    model = prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state_dict = model.state_dict()
    merged = {m.base: m.merged(state_dict) for m in find_lora_modules(state_dict, lora_scalings(model))}
    assert len(merged) == 14  # 7 linear layers x 2 decoder layers
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for base, tensor in merged.items():
        assert torch.allclose(tensor, reference[normalize_name(base)], atol=1e-6)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="no LoRA scaling"):
        find_lora_modules(state_dict, None)
