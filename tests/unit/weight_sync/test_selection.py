"""What a publish sends (``weight_sync.selection``), without a server: in training_mode lora, the adapters and the
head when the server holds the LoRA bases, merged weights (or a refusal) when it does not."""

from __future__ import annotations

import pytest
import torch
from sync_helpers import load_rm

from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.lora import LoraBases, split_adapter_name
from verl_vllm_rm.protocol.names import RewardModelTrainingMode, normalize_name
from verl_vllm_rm.weight_sync.selection import select_update

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _tiny_inventory(model, bases: LoraBases) -> Inventory:
    """The inventory a fp32 server of ``model`` reports, built from its merged state dict."""
    merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    params = [ParamSpec(n, "float32", tuple(t.shape)) for n, t in merged.state_dict().items()]
    modules = tuple(sorted(n.removesuffix(".weight") for n in merged.state_dict()
                           if n.endswith("proj.weight")))
    return Inventory(params, FUSED, LoraBases(bases.state, bases.where, 0, modules if bases.state == "held" else (),
                                              bases.reason))


def test_selection_sends_adapters_and_the_head_when_the_server_holds_the_bases(tiny_rm):
    model = prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=8)
    inventory = _tiny_inventory(load_rm(tiny_rm), LoraBases("held", "host"))
    selection = select_update(inventory, model, RewardModelTrainingMode.LORA, ("score.*",), None, lora_wire="auto")
    names = [i.spec.name for i in selection.items]
    assert len(names) == 29 and "score.weight" in names
    assert all(split_adapter_name(n) for n in names if n != "score.weight")
    assert selection.lora_scaling == {n.removesuffix(".lora_A.weight"): 2.0 for n in names if "lora_A" in n}
    assert selection.fallback_reason is None
    state_dict = model.state_dict()
    raw = {normalize_name(k.replace(".lora_A.default.weight", ".weight")): v for k, v in state_dict.items()
           if ".lora_A." in k}
    for item in selection.items:
        if item.spec.name.endswith(".lora_A.weight"):
            assert torch.equal(item.produce(), raw[item.spec.name.replace(".lora_A.weight", ".weight")])


def test_selection_falls_back_to_merged_or_refuses_without_bases(tiny_rm):
    model = prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=8)
    inventory = _tiny_inventory(load_rm(tiny_rm), LoraBases("unavailable", "host", reason="over the cap"))
    selection = select_update(inventory, model, RewardModelTrainingMode.LORA, ("score.*",), None, lora_wire="auto")
    assert len(selection.items) == 21 and selection.lora_scaling is None
    assert selection.fallback_reason == "its LoRA base store is unavailable: over the cap"
    with pytest.raises(WeightUpdateRefused, match="cannot send LoRA adapters: its LoRA base store is unavailable: "
                                                  "over the cap; start the server with --weight-update-lora-bases"):
        select_update(inventory, model, RewardModelTrainingMode.LORA, ("score.*",), None, lora_wire="adapters")
    with pytest.raises(ValueError, match="lora_wire must be one of"):
        select_update(inventory, model, RewardModelTrainingMode.LORA, ("score.*",), None, lora_wire="both")
