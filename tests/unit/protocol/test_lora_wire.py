"""LoRA adapters on the wire, without a server: names, the one merge, the base-store report and every refusal."""

from __future__ import annotations

import math

import pytest
import torch
from sync_helpers import load_rm

from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.lora import LoraBases, adapter_name, split_adapter_name
from verl_vllm_rm.protocol.names import RewardModelTrainingMode, normalize_name
from verl_vllm_rm.weight_sync.selection import select_update

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
ATTN = "model.layers.0.self_attn"
Q = f"{ATTN}.q_proj"


def _inventory(state: str = "held", dtype: str = "float32", reason: str | None = None) -> Inventory:
    """One attention block (q 8x16, k and v 4x16, with biases), o_proj 16x8 and a head."""
    params = [ParamSpec(f"{ATTN}.q_proj.weight", dtype, (8, 16)), ParamSpec(f"{ATTN}.q_proj.bias", dtype, (8,)),
              ParamSpec(f"{ATTN}.k_proj.weight", dtype, (4, 16)), ParamSpec(f"{ATTN}.k_proj.bias", dtype, (4,)),
              ParamSpec(f"{ATTN}.v_proj.weight", dtype, (4, 16)), ParamSpec(f"{ATTN}.v_proj.bias", dtype, (4,)),
              ParamSpec(f"{ATTN}.o_proj.weight", dtype, (16, 8)), ParamSpec("score.weight", "float32", (1, 16))]
    modules = (f"{ATTN}.q_proj", f"{ATTN}.k_proj", f"{ATTN}.v_proj", f"{ATTN}.o_proj")
    bases = LoraBases(state, "host", 0, modules if state == "held" else (), reason)
    return Inventory(params, FUSED, bases)


def _adapter(module: str, r: int = 2, out: int = 8, inp: int = 16, dtype: str = "float32") -> list[ParamSpec]:
    return [ParamSpec(adapter_name(module, "A"), dtype, (r, inp)), ParamSpec(adapter_name(module, "B"), dtype, (out, r))]


def _refusal(specs, scaling, inventory=None, mode="lora") -> str:
    with pytest.raises(WeightUpdateRefused) as info:
        (inventory or _inventory()).check_update(specs, mode, scaling=scaling)
    return str(info.value)


def test_adapter_names_round_trip():
    assert adapter_name(Q, "A") == f"{Q}.lora_A.weight"
    assert split_adapter_name(f"{Q}.lora_B.weight") == (Q, "B")
    assert split_adapter_name(f"{Q}.weight") is None
    with pytest.raises(ValueError, match="adapter kind must be one of"):
        adapter_name(Q, "C")


def test_an_adapter_update_within_the_held_bases_passes():
    specs = _adapter(Q) + _adapter(f"{ATTN}.o_proj", out=16, inp=8) + [ParamSpec("score.weight", "float32", (1, 16))]
    _inventory().check_update(specs, "lora", scaling={Q: 2.0, f"{ATTN}.o_proj": 0.5})  # k, v come from the store


@pytest.mark.parametrize("specs, scaling, needle", [
    (_adapter(Q, inp=15), {Q: 2.0}, "lora_A of 'model.layers.0.self_attn.q_proj' is [2, 15] but the base weight is "
                                    "[8, 16]: lora_A must be [r, 16]"),
    (_adapter(Q, out=9), {Q: 2.0}, "lora_B of 'model.layers.0.self_attn.q_proj' is [9, 2] but the base weight is "
                                   "[8, 16]: lora_B must be [8, r]"),
    ([_adapter(Q, r=2)[0], _adapter(Q, r=3)[1]], {Q: 2.0}, "lora_A's rank 2 and lora_B's rank 3 must be equal"),
    (_adapter(Q, dtype="bfloat16"), {Q: 2.0}, "lora_A of 'model.layers.0.self_attn.q_proj' is bfloat16 but the "
                                              "server's weight is float32: send adapters in the server's dtype"),
    (_adapter(Q)[:1], {Q: 2.0}, "adapter of 'model.layers.0.self_attn.q_proj' lacks lora_B: send both factors"),
    (_adapter(Q) + [ParamSpec(f"{Q}.weight", "float32", (8, 16))], {Q: 2.0},
     "is sent both as adapters and as a full weight: send one of the two"),
    (_adapter(Q), {}, "needs a finite scaling in the body's lora.scaling, got None"),
    (_adapter(Q), {Q: math.inf}, "needs a finite scaling in the body's lora.scaling, got inf"),
    (_adapter(Q), {Q: 1.0, "model.layers.0.mlp.up_proj": 1.0},
     "lora.scaling names modules the update sends no adapters for: ['model.layers.0.mlp.up_proj']"),
    (_adapter("score", out=1), {"score": 1.0}, "'score' is not among the server's held LoRA bases: publish it merged"),
    (_adapter("model.nowhere"), {}, "unknown parameter 'model.nowhere.lora_A.weight'"),
], ids=["A in", "B out", "rank", "dtype", "A without B", "adapter and full", "no scaling", "inf scaling",
        "extra scaling", "head not held", "no base module"])
def test_each_adapter_problem_is_named(specs, scaling, needle):
    assert needle in _refusal(specs, scaling)


def test_a_module_outside_the_store_is_refused():
    inventory = _inventory()
    inventory.set_lora_bases(LoraBases("held", "device", 0, (Q,)))
    message = _refusal(_adapter(f"{ATTN}.o_proj", out=16, inp=8), {f"{ATTN}.o_proj": 1.0}, inventory)
    assert "'model.layers.0.self_attn.o_proj' is not among the server's held LoRA bases" in message
    # q's group siblings k and v are held in the store with it: q's adapters alone complete the group
    inventory.check_update(_adapter(Q), "lora", scaling={Q: 1.0})


@pytest.mark.parametrize("bases, needle", [
    (LoraBases("unavailable", "host", reason="over the cap"), "its base store is unavailable (over the cap)"),
    (None, "it reports no base store"),
])
def test_adapters_to_a_server_without_bases_are_refused(bases, needle):
    inventory = _inventory()
    inventory.set_lora_bases(bases)
    message = _refusal(_adapter(Q), {Q: 1.0}, inventory)
    assert f"the update sends LoRA adapters but this server cannot merge them: {needle}" in message
    assert "--weight-update-lora-bases host|device" in message


def test_adapters_travel_only_in_lora_mode():
    message = _refusal(_adapter(Q), {Q: 1.0}, mode="full")
    assert "is a LoRA adapter but training_mode is full; adapters travel only in training_mode 'lora'" in message


GOOD_BASES = {"state": "held", "where": "host", "bytes": 0, "modules": [], "reason": None, "captured": False}


@pytest.mark.parametrize("payload, needle", [
    ({"state": "held"}, "expected exactly the fields"),
    ({**GOOD_BASES, "state": "maybe"}, "'state' must be one of"),
    ({**GOOD_BASES, "where": "disk"}, "'where' must be one of"),
    ({**GOOD_BASES, "bytes": -1}, "'bytes' must be a non-negative integer"),
    ({**GOOD_BASES, "modules": "q"}, "'modules' must be a list of module names"),
    ({**GOOD_BASES, "reason": 3}, "'reason' must be a string or null"),
    ({**GOOD_BASES, "captured": "yes"}, "'captured' must be a boolean, true only for a held store"),
    ({**GOOD_BASES, "state": "off", "where": "off", "captured": True}, "got True with state 'off'"),
], ids=["fields", "state", "where", "bytes", "modules", "reason", "captured", "captured-off"])
def test_a_bad_lora_bases_report_is_refused(payload, needle):
    with pytest.raises(ValueError, match="bad lora_bases") as info:
        LoraBases.from_json(payload)
    assert needle in str(info.value)


def test_a_good_lora_bases_report_reads_back_as_sent():
    assert LoraBases.from_json(GOOD_BASES).to_json() == GOOD_BASES


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
