"""LoRA adapters on the wire (``protocol.lora``), without a server: names, the base-store report and every refusal
of an update's adapters (as ``Inventory.check_update`` asks ``adapter_problems``)."""

from __future__ import annotations

import math

import pytest
import torch

from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.lora import LoraBases, adapter_name, merge_lora_weight, split_adapter_name

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
    return [ParamSpec(adapter_name(module, "A"), dtype, (r, inp)),
            ParamSpec(adapter_name(module, "B"), dtype, (out, r))]


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


def test_the_merge_is_w0_plus_scaling_times_b_at_a_cast_once():
    w0 = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.bfloat16)
    a = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)  # [r=1, in=2]
    b = torch.tensor([[1.0], [3.0]], dtype=torch.bfloat16)  # [out=2, r=1]
    merged = merge_lora_weight(w0, a, b, 0.5, torch.float32)
    assert merged.dtype == torch.float32
    assert torch.equal(merged, torch.tensor([[1.5, 1.0], [1.5, 4.0]]))
    # 1 + 3 * 2**-9 computed in fp32, then cast to bfloat16's nearest value (its spacing at 1 is 2**-7)
    tiny = merge_lora_weight(torch.ones(1, 1), torch.full((1, 1), 2.0 ** -9), torch.ones(1, 1), 3.0, torch.bfloat16)
    assert tiny.dtype == torch.bfloat16 and tiny.item() == 1.0 + 2.0 ** -7


def test_an_adapter_that_is_no_pair_of_matrices_or_of_a_rank_out_of_bounds_is_refused():
    vector_a = [ParamSpec(adapter_name(Q, "A"), "float32", (16,)), ParamSpec(adapter_name(Q, "B"), "float32", (8, 2))]
    assert ("adapter of 'model.layers.0.self_attn.q_proj': lora_A and lora_B must be matrices, got [16] and [8, 2]"
            in _refusal(vector_a, {Q: 1.0}))
    assert ("adapter of 'model.layers.0.self_attn.q_proj': lora_A's rank 9 and lora_B's rank 9 must be equal and "
            "within [1, 8]" in _refusal(_adapter(Q, r=9), {Q: 1.0}))
    assert "lora_A's rank 0 and lora_B's rank 0" in _refusal(_adapter(Q, r=0), {Q: 1.0})
