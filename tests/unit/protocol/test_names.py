"""Parameter names and training modes (``protocol.names``): HF/PEFT/FSDP names mapped to the server's, the
``model.`` prefix fixed against the server's names, LoRA tensors and heads told apart (no server)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.protocol.names import (
    RewardModelTrainingMode,
    is_head,
    is_peft_tensor,
    normalize_name,
    resolve_name,
)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
         "model.layers.0.self_attn.q_proj.weight"),
        ("base_model.model.score.modules_to_save.default.weight", "score.weight"),
        ("base_model.model.score.original_module.weight", None),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
        ("base_model.model.model.embed_tokens.lora_embedding_B.default", None),
        ("module._fsdp_wrapped_module.model.layers.1._checkpoint_wrapped_module.mlp.up_proj.weight",
         "model.layers.1.mlp.up_proj.weight"),
        ("_orig_mod.model.norm.weight", "model.norm.weight"),
        ("score.weight", "score.weight"),
    ],
)
def test_normalize_name(raw, expected):
    assert normalize_name(raw) == expected


def test_resolve_name_fixes_the_model_prefix():
    known = {"model.norm.weight", "score.weight"}
    assert resolve_name("model.model.norm.weight", known) == "model.norm.weight"
    assert resolve_name("model.model.model.norm.weight", known) == "model.norm.weight"
    assert resolve_name("norm.weight", known) == "model.norm.weight"
    assert resolve_name("score.weight", known) == "score.weight"
    assert resolve_name("model.nope.weight", known) == "model.nope.weight"


def test_a_training_mode_is_read_from_its_name_and_an_unknown_one_is_refused_naming_the_valid_ones():
    assert RewardModelTrainingMode.parse("lora") is RewardModelTrainingMode.LORA
    assert RewardModelTrainingMode.parse(RewardModelTrainingMode.FULL) is RewardModelTrainingMode.FULL
    assert RewardModelTrainingMode.parse("head_only") == "head_only"
    with pytest.raises(ValueError, match=r"^unknown training_mode 'Lora'; use one of \['head_only', 'lora', 'full'\]$"):
        RewardModelTrainingMode.parse("Lora")


@pytest.mark.parametrize("name, peft", [
    ("base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight", True),
    ("model.layers.0.mlp.up_proj.lora_B.weight", True),
    ("base_model.model.model.embed_tokens.lora_embedding_A.default", True),
    ("base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector.default.weight", True),
    ("model.layers.0.mlp.up_proj.weight", False),
    ("model.layers.0.mlp.flora_A.weight", False),  # a module whose name only ends in lora_A
], ids=["lora_A", "lora_B wire name", "embedding B", "DoRA magnitude", "plain weight", "lookalike"])
def test_lora_factors_and_dora_magnitudes_are_told_from_other_tensors(name, peft):
    assert is_peft_tensor(name) is peft


def test_a_head_is_a_name_matching_one_of_the_head_patterns_case_sensitively():
    assert is_head("score.weight") and is_head("classifier.bias")
    assert not is_head("model.score.weight") and not is_head("Score.weight") and not is_head("score")
    assert is_head("v_head.weight", ("v_head.*",)) and not is_head("score.weight", ("v_head.*",))
    assert not is_head("score.weight", ())
