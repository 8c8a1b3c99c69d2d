"""What a publish may send (``weight_sync.outgoing``), no server: a trainer's state dict under the server's names, in
the server's dtypes, the trained tensors told apart, and tensors never materialised refused."""

from __future__ import annotations

import re

import pytest
import torch

from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.weight_sync.outgoing import ServerNamedTensors, full_tensor

UP = "model.layers.0.mlp.up_proj.weight"
INVENTORY = Inventory([ParamSpec(UP, "float32", (4, 2)), ParamSpec("score.weight", "bfloat16", (1, 2)),
                       ParamSpec("model.norm.weight", "float32", (2,))], {})


def _peft_state_dict() -> dict[str, torch.Tensor]:
    """A PEFT model's state dict: a LoRA-adapted up_proj, the head in modules_to_save, a backbone-only norm name."""
    return {
        "base_model.model.model.layers.0.mlp.up_proj.base_layer.weight": torch.arange(8.0).view(4, 2),
        "base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight": torch.ones(1, 2),
        "base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight": torch.ones(4, 1),
        "base_model.model.score.modules_to_save.default.weight": torch.tensor([[0.5, -0.5]]),
        "base_model.model.score.original_module.weight": torch.zeros(1, 2),
        "base_model.model.norm.weight": torch.tensor([1.0, 2.0]),
        "extra.weight": torch.ones(3, dtype=torch.float16),
    }


def test_a_plain_tensor_is_its_own_full_tensor():
    t = torch.ones(2)
    assert full_tensor(t) is t


def test_a_state_dict_is_renamed_to_the_servers_names_and_its_trained_tensors_are_the_head():
    tensors = ServerNamedTensors(_peft_state_dict(), INVENTORY, ("score.*",))
    specs = {name: entry.spec for name, entry in tensors.entries.items()}
    assert specs == {
        UP: ParamSpec(UP, "float32", (4, 2)),
        "score.weight": ParamSpec("score.weight", "bfloat16", (1, 2)),  # the server's dtype, not the trainer's
        "model.norm.weight": ParamSpec("model.norm.weight", "float32", (2,)),  # the missing model. prefix added
        "extra.weight": ParamSpec("extra.weight", "float16", (3,)),  # unknown to the server: its own dtype
    }
    assert tensors.trained == {"score.weight"}
    assert not any(entry.gathers for entry in tensors.entries.values())
    assert torch.equal(tensors.entries["score.weight"].produce(), torch.tensor([[0.5, -0.5]]))


def test_outgoing_entries_are_sorted_once_each_and_a_merge_replaces_what_an_entry_produces():
    tensors = ServerNamedTensors(_peft_state_dict(), INVENTORY, ("score.*",))
    tensors.produce_as(UP, lambda: torch.full((4, 2), 7.0))
    chosen = tensors.outgoing(["score.weight", UP, "score.weight", "model.norm.weight"])
    assert [entry.spec.name for entry in chosen] == [UP, "model.norm.weight", "score.weight"]
    assert chosen[0].gathers and chosen[0].spec == ParamSpec(UP, "float32", (4, 2))
    assert torch.equal(chosen[0].produce(), torch.full((4, 2), 7.0))
    assert tensors.trained == {"score.weight", UP}


def test_a_tensor_never_materialised_is_refused_when_chosen_only():
    state_dict = {"model.norm.weight": torch.empty(2, device="meta"), "score.weight": torch.ones(1, 2)}
    tensors = ServerNamedTensors(state_dict, INVENTORY, ("score.*",))
    assert tensors.never_loaded == {"model.norm.weight"}
    assert [entry.spec.name for entry in tensors.outgoing(["score.weight"])] == ["score.weight"]
    with pytest.raises(WeightUpdateRefused, match=re.escape(
            "['model.norm.weight'] are on torch's meta device (never materialised, e.g. built under init_empty_weights "
            "and not loaded): load the model's weights before publishing")):
        tensors.outgoing(["model.norm.weight", "score.weight"])
