"""The trainer-side LoRA merge matches peft's and leaves the trained model alone (no server)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from sync_helpers import load_rm

from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.protocol.lora import merge_lora_weight
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
    modules = find_lora_modules(state_dict, lora_scalings(model))
    merged = {m.base: m.merged(state_dict) for m in modules}
    assert len(merged) == 14  # 7 linear layers x 2 decoder layers
    for m in modules:  # the trainer's merge is the one the server computes too, bit for bit
        assert torch.equal(merged[m.base], merge_lora_weight(state_dict[m.base], state_dict[m.lora_a],
                                                             state_dict[m.lora_b], m.scaling, torch.float32))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    for base, tensor in merged.items():
        assert torch.allclose(tensor, reference[normalize_name(base)], atol=1e-6)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match=r"no LoRA scaling for 'base_model\.model\.model\.layers\.0\.mlp\.down_proj': "
                                         r"pass the PEFT model itself to publish\(\), or lora_scaling=alpha/r"):
        find_lora_modules(state_dict, None)


@pytest.fixture(scope="module")
def lora_state_dict(tiny_rm) -> dict[str, torch.Tensor]:
    """A PEFT LoRA model's state dict (rank 4 on every linear layer)."""
    return prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=16).state_dict()


Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("dropped, missing", [
    (f"{Q}.lora_B.default.weight", f"['{Q}.lora_B.default.weight']"),
    (f"{Q}.base_layer.weight", f"['{Q}.base_layer.weight']"),
], ids=["lora_B", "base weight"])
def test_a_lora_module_missing_a_tensor_is_refused_naming_it(lora_state_dict, dropped, missing):
    """A hand-filtered state dict that keeps a module's lora_A but drops its lora_B or base weight cannot be
    merged: refused before anything is sent, naming the tensor and asking for the whole state dict."""
    state_dict = {k: v for k, v in lora_state_dict.items() if k != dropped}
    with pytest.raises(ValueError, match=re.escape(
            f"LoRA module '{Q}' has '{Q}.lora_A.default.weight' but the state dict lacks {missing}: publish the "
            "PEFT model's whole state dict (each adapted module's base weight, lora_A and lora_B)")):
        find_lora_modules(state_dict, 4.0)


def test_dora_adapters_are_refused(tiny_rm):
    """DoRA rescales each merged column by its magnitude vector, which the plain ``W + s * B @ A`` merge would
    silently drop: a DoRA model (peft's own, ``use_dora=True``) is refused, naming the fix."""
    from peft import get_peft_model

    from verl_vllm_rm.online.trainable import lora_config

    base = load_rm(tiny_rm)
    config = lora_config(base, rank=4, alpha=16)
    config.use_dora = True
    model = get_peft_model(base, config)
    with pytest.raises(ValueError, match=re.escape(
            "DoRA adapters (lora_magnitude_vector) are not supported: train the adapters with "
            "LoraConfig(use_dora=False), or merge them yourself and publish in training_mode 'full'")):
        find_lora_modules(model.state_dict(), lora_scalings(model))
