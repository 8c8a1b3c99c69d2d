"""The tiny reward models shaped like the published families (``dev/tiny_rm_families.py``), built offline here
(each under a second): the architecture name, config fields and tensor names vLLM loads for each, and InternLM2's
packed ``wqkv``. (Served and scored by vLLM: tests/integration/server/test_model_families.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from verl_vllm_rm.dev.tiny_rm import TinyRMSpec
from verl_vllm_rm.dev.tiny_rm_families import (HELPSTEER_ATTRIBUTES, INTERNLM2_REWARD_TOKEN, _internlm2_wqkv,
                                               build_tiny_attribute_rm, build_tiny_internlm2_reward_model,
                                               build_tiny_qwen2_prm, build_tiny_qwen2_reward_model,
                                               build_tiny_two_class_rm)

H = TinyRMSpec().hidden_size  # 128: 4 heads of 32, 2 KV heads


def shapes(model_dir) -> dict[str, tuple[int, ...]]:
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def config(model_dir) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_internlm2_packs_each_kv_heads_queries_then_its_k_then_its_v():
    """4 query heads over 2 KV heads, one row per head (head size 1): [q0 q1 k0 v0 q2 q3 k1 v1]."""
    q = torch.tensor([[0.0, 0], [1, 1], [2, 2], [3, 3]])
    k = torch.tensor([[10.0, 10], [11, 11]])
    v = torch.tensor([[20.0, 20], [21, 21]])
    assert _internlm2_wqkv(q, k, v, kv_heads=2)[:, 0].tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert _internlm2_wqkv(q, k, v, kv_heads=1)[:, 0].tolist() == [0, 1, 2, 3, 10, 11, 20, 21]


def test_the_attribute_rm_regresses_one_named_output_per_attribute(tmp_path):
    out = build_tiny_attribute_rm(tmp_path / "attr")
    cfg = config(out)
    assert cfg["architectures"] == ["Qwen2ForSequenceClassification"] and cfg["problem_type"] == "regression"
    assert cfg["id2label"] == {str(i): name for i, name in enumerate(HELPSTEER_ATTRIBUTES)}
    assert shapes(out)["score.weight"] == (5, H)
    assert config(build_tiny_attribute_rm(tmp_path / "two", attributes=("a", "b")))["id2label"] == {"0": "a",
                                                                                                   "1": "b"}


def test_the_two_class_rm_has_bad_then_good(tmp_path):
    out = build_tiny_two_class_rm(tmp_path / "rm")
    assert config(out)["id2label"] == {"0": "bad", "1": "good"} and shapes(out)["score.weight"] == (2, H)


@pytest.mark.parametrize(("build", "architecture", "outputs"), [
    (build_tiny_qwen2_reward_model, "Qwen2ForRewardModel", 1),
    (build_tiny_qwen2_prm, "Qwen2ForProcessRewardModel", 2),
], ids=["reward-model", "prm"])
def test_the_qwen2_score_head_models_carry_the_two_layer_head_vllm_loads(tmp_path, build, architecture, outputs):
    out = build(tmp_path / "rm")
    assert config(out)["architectures"] == [architecture]
    tensors = shapes(out)
    assert (tensors["score.0.weight"], tensors["score.0.bias"]) == ((H, H), (H,))
    assert (tensors["score.2.weight"], tensors["score.2.bias"]) == ((outputs, H), (outputs,))
    assert tensors["model.embed_tokens.weight"][1] == H and "lm_head.weight" not in tensors
    assert not [name for name in tensors if not name.startswith(("model.", "score."))]


def test_the_internlm2_rm_has_its_names_its_config_module_and_its_reward_token(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    out = build_tiny_internlm2_reward_model(tmp_path / "rm")
    tensors = shapes(out)
    assert tensors["model.layers.0.attention.wqkv.weight"] == (H + 2 * 64, H)  # 4 query heads + 2 k + 2 v, of 32
    assert tensors["model.layers.1.attention.wo.weight"] == (H, H) and tensors["v_head.weight"] == (1, H)
    assert {"model.tok_embeddings.weight", "model.layers.0.feed_forward.w1.weight",
            "model.layers.0.attention_norm.weight", "model.layers.0.ffn_norm.weight",
            "model.norm.weight"} <= set(tensors)
    assert not [name for name in tensors if "proj" in name or "self_attn" in name or "mlp" in name]
    tokenizer = AutoTokenizer.from_pretrained(out)
    loaded = AutoConfig.from_pretrained(out, trust_remote_code=True)
    assert (loaded.model_type, loaded.architectures) == ("internlm2", ["InternLM2ForRewardModel"])
    assert loaded.reward_token_id == tokenizer.convert_tokens_to_ids(INTERNLM2_REWARD_TOKEN) != tokenizer.unk_token_id
    assert tokenizer(f"a{INTERNLM2_REWARD_TOKEN}").input_ids[-1] == loaded.reward_token_id  # one special token
    assert loaded.vocab_size == len(tokenizer) == tensors["model.tok_embeddings.weight"][0]
