"""The server's parameter inventory (``protocol.inventory``): fused groups, the checks every update passes and the
metadata entries read strictly (no server)."""

from __future__ import annotations

import re

import pytest
from sync_helpers import load_rm

from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused, module_key
from verl_vllm_rm.protocol.lora import LoraBases

QWEN2_FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.fixture(scope="module")
def inventory(tiny_rm) -> Inventory:
    """What the server reports for the tiny RM: its checkpoint tensors and Qwen2's fused modules."""
    specs = [ParamSpec(n, "float32", tuple(t.shape)) for n, t in load_rm(tiny_rm).state_dict().items()]
    return Inventory(specs, QWEN2_FUSED)


def test_inventory_groups_fused_modules_with_their_biases(inventory):
    assert inventory.group_of("model.layers.0.self_attn.k_proj.bias") == [
        f"model.layers.0.self_attn.{p}_proj.{k}" for p in "kqv" for k in ("bias", "weight")
    ]
    assert inventory.group_of("model.layers.0.mlp.up_proj.weight") == [
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"
    ]
    assert inventory.group_of("score.weight") == ["score.weight"]
    assert inventory.complete_groups(["model.layers.1.mlp.gate_proj.weight"]) == [
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"
    ]


def test_check_update_lists_every_problem(inventory):
    specs = [
        ParamSpec("model.layers.0.self_attn.q_proj.weight", "float32", (128, 128)),
        ParamSpec("score.weight", "float16", (1, 128)),
        ParamSpec("model.norm.weight", "float32", (64,)),
    ]
    with pytest.raises(WeightUpdateRefused) as err:
        inventory.check_update(specs, "head_only")
    message = str(err.value)
    for fragment in ("partial module 'model.layers.0.self_attn.qkv_proj'", "is float16", "has shape [64]",
                     "backbone tensor but training_mode is head_only"):
        assert fragment in message
    inventory.check_update([ParamSpec(n, p.dtype, p.shape) for n, p in inventory.params.items()], "full")


def test_total_size_cap(inventory):
    head = [ParamSpec("score.weight", "float32", (1, 128))]
    inventory.check_update(head, "head_only", max_bytes=512)
    with pytest.raises(WeightUpdateRefused, match="carries 512 bytes, more than this server's cap of 511"):
        inventory.check_update(head, "head_only", max_bytes=511)


def test_a_checkpoint_tensor_loads_into_its_fused_module_or_its_own():
    assert module_key("model.layers.3.self_attn.v_proj.bias", QWEN2_FUSED) == "model.layers.3.self_attn.qkv_proj"
    assert module_key("model.layers.3.mlp.gate_proj.weight", QWEN2_FUSED) == "model.layers.3.mlp.gate_up_proj"
    assert module_key("model.layers.3.mlp.down_proj.weight", QWEN2_FUSED) == "model.layers.3.mlp.down_proj"
    assert module_key("q_proj.weight", QWEN2_FUSED) == "qkv_proj"
    assert module_key("score.weight", {}) == "score"
    assert module_key("bias", {}) == "bias"


def test_a_spec_counts_its_bytes_and_reads_back_from_its_json():
    spec = ParamSpec("model.norm.weight", "bfloat16", (3, 5))
    assert spec.nbytes == 30
    assert ParamSpec("s", "float64", ()).nbytes == 8 and ParamSpec("e", "int8", (0, 4)).nbytes == 0
    assert spec.to_json() == {"name": "model.norm.weight", "dtype": "bfloat16", "shape": [3, 5]}
    assert ParamSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize("item, message", [
    (["w", "float32", [1]], "bad metadata entry ['w', 'float32', [1]]: each entry is exactly {name, dtype, shape}"),
    ({"name": "w", "dtype": "float32"}, "each entry is exactly {name, dtype, shape}"),
    ({"name": "", "dtype": "float32", "shape": [1]}, "'name' must be a non-empty string"),
    ({"name": 7, "dtype": "float32", "shape": [1]}, "'name' must be a non-empty string"),
    ({"name": "w", "dtype": "complex64", "shape": [1]},
     "bad metadata entry for 'w': dtype 'complex64' is not one of ['bfloat16', 'float16', 'float32', 'float64', "
     "'float8_e4m3fn', 'float8_e5m2', 'int32', 'int64', 'int8', 'uint8']"),
    ({"name": "w", "dtype": "float32", "shape": [2, -1]},
     "bad metadata entry for 'w': 'shape' must be a list of at most 8 non-negative integers, got [2, -1]"),
    ({"name": "w", "dtype": "float32", "shape": [True]}, "non-negative integers, got [True]"),
    ({"name": "w", "dtype": "float32", "shape": [1] * 9}, "at most 8 non-negative integers"),
    ({"name": "w", "dtype": "float32", "shape": "4"}, "non-negative integers, got '4'"),
], ids=["not a mapping", "missing shape", "empty name", "int name", "dtype", "negative dim", "bool dim", "9 dims",
        "string shape"])
def test_a_bad_metadata_entry_is_refused_naming_the_problem(item, message):
    with pytest.raises(WeightUpdateRefused, match=re.escape(message)):
        ParamSpec.from_json(item)


def test_an_inventory_reads_back_from_its_json_with_its_base_store():
    params = [ParamSpec("model.layers.0.mlp.gate_proj.weight", "float32", (4, 2)),
              ParamSpec("model.layers.0.mlp.up_proj.weight", "float32", (4, 2)), ParamSpec("score.weight", "float32",
                                                                                        (1, 2))]
    bases = LoraBases("held", "host", 64, ("model.layers.0.mlp.up_proj",))
    payload = Inventory(params, QWEN2_FUSED, bases).to_json()
    assert payload["lora_bases"] == {"state": "held", "where": "host", "bytes": 64,
                                     "modules": ["model.layers.0.mlp.up_proj"], "reason": None, "captured": False}
    again = Inventory.from_json(payload)
    assert list(again.params.values()) == params and again.fused_modules == QWEN2_FUSED
    # a held store holds whole fused groups: up_proj's sibling gate_proj is held with it
    assert again.lora_bases.held_names == {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"}
    assert "lora_bases" not in Inventory(params, QWEN2_FUSED).to_json()
    assert Inventory.from_json({"params": []}).fused_modules == {}


def test_an_update_that_is_empty_repeats_a_name_or_misspells_one_is_refused(inventory):
    with pytest.raises(WeightUpdateRefused, match="^weight update refused: the update is empty: nothing matched the "
                                                  "training mode in the given state dict$"):
        inventory.check_update([], "full")
    head = ParamSpec("score.weight", "float32", (1, 128))
    with pytest.raises(WeightUpdateRefused, match="parameter 'score.weight' appears twice"):
        inventory.check_update([head, head], "head_only")
    with pytest.raises(WeightUpdateRefused, match=re.escape("unknown parameter 'model.norm.weigth' (did you mean "
                                                            "'model.norm.weight'?)")):
        inventory.check_update([ParamSpec("model.norm.weigth", "float32", (128,))], "full")
    with pytest.raises(WeightUpdateRefused, match=r"^weight update refused: unknown parameter 'zzz'$"):
        inventory.check_update([ParamSpec("zzz", "float32", (1,))], "full")
    with pytest.raises(WeightUpdateRefused, match=re.escape("'score.weight' is complex64, not one of ['bfloat16'")):
        inventory.check_update([ParamSpec("score.weight", "complex64", (1, 128))], "head_only")
    with pytest.raises(ValueError, match="unknown training_mode 'heads'"):
        inventory.check_update([head], "heads")
