"""Which modules an update's reload touches (``server.weights.rollback``), in process, on a model laid out as vLLM's
(fused ``qkv_proj`` and ``gate_up_proj`` loading checkpoint names): the reload of the touched modules and its undo
run inside vLLM's layerwise reload, on a real server (tests/integration/weight_sync/test_reload_rollback.py)."""

from __future__ import annotations

from torch import nn

from verl_vllm_rm.server.weights.rollback import names_under, reload_targets

ATTN = "model.layers.0.self_attn"


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj, self.self_attn.o_proj = nn.Linear(2, 6), nn.Linear(2, 2)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj, self.mlp.down_proj = nn.Linear(2, 4), nn.Linear(2, 2)


class VllmLikeModel(nn.Module):
    """Two decoder layers, a norm and a score head, with vLLM's ``packed_modules_mapping``."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([Layer(), Layer()])
        self.model.norm = nn.LayerNorm(2)
        self.score = nn.Linear(2, 1)


CHECKPOINT = [f"model.layers.{i}.self_attn.{p}_proj.{k}" for i in (0, 1) for p in "qkvo" for k in ("weight", "bias")] \
    + [f"model.layers.{i}.mlp.{p}_proj.weight" for i in (0, 1) for p in ("gate", "up", "down")] \
    + ["model.norm.weight", "model.norm.bias", "score.weight", "score.bias"]


def test_an_update_reloads_only_the_modules_its_tensors_load_into_sorted():
    model = VllmLikeModel()
    targets = reload_targets(model, ["score.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.q_proj.bias"])
    assert targets == [model.model.layers[0].self_attn.qkv_proj, model.score]
    assert reload_targets(model, ["model.layers.1.mlp.up_proj.weight"]) == [model.model.layers[1].mlp.gate_up_proj]
    assert reload_targets(model, []) == []


def test_a_name_that_maps_to_no_module_reloads_the_whole_model():
    model = VllmLikeModel()
    assert reload_targets(model, ["score.weight", "model.layers.7.mlp.up_proj.weight"]) == [model]


def test_the_names_under_the_targets_are_those_an_undo_reloads():
    model = VllmLikeModel()
    qkv, layer1 = model.model.layers[0].self_attn.qkv_proj, model.model.layers[1]
    assert names_under(model, [qkv], CHECKPOINT) == [f"{ATTN}.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")]
    assert names_under(model, [model.score, model.model.norm], CHECKPOINT) == [
        "model.norm.weight", "model.norm.bias", "score.weight", "score.bias"]
    under_layer1 = names_under(model, [layer1], CHECKPOINT)  # a module's names include those of its children
    assert under_layer1 == [n for n in CHECKPOINT if n.startswith("model.layers.1.")] and len(under_layer1) == 11
    assert names_under(model, [model], CHECKPOINT) == CHECKPOINT
    assert names_under(model, [nn.Linear(1, 1)], CHECKPOINT) == []  # not the model's: nothing under it


def test_a_model_without_a_packing_map_reloads_each_tensors_own_module():
    model = nn.Sequential()
    model.add_module("q_proj", nn.Linear(1, 1))
    assert reload_targets(model, ["q_proj.weight"]) == [model.q_proj]
    assert names_under(model, [model.q_proj], ["q_proj.weight", "q_proj.bias", "k_proj.weight"]) == [
        "q_proj.weight", "q_proj.bias"]
