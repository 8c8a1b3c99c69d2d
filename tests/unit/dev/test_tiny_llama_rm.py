"""The tiny Llama RM a user might bring (``dev/tiny_llama_rm.py``), built offline here (under a few seconds): a
``LlamaForSequenceClassification`` with one output on a SentencePiece-style Unigram tokenizer of its own (no chat
template), not the tiny RM's. (Inside main_ppo: tests/integration/dev/test_tiny_ppo_any_rm.py.)"""

from __future__ import annotations

import json

from verl_vllm_rm.dev.tiny_llama_rm import TinyLlamaRMSpec, build_tiny_llama_rm, build_unigram_tokenizer


def test_the_tokenizer_splits_as_sentencepiece_with_its_own_specials():
    spec = TinyLlamaRMSpec()
    tokenizer = build_unigram_tokenizer(spec)
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<pad>", "<s>", "</s>", "<unk>")
    assert tokenizer.convert_tokens_to_ids(["<pad>", "<s>", "</s>", "<unk>"]) == [0, 1, 2, 3]
    assert len(tokenizer) <= spec.vocab_size and not tokenizer.chat_template
    pieces = tokenizer.tokenize("the answer is")
    assert pieces[0].startswith("▁") and "".join(pieces).replace("▁", " ").strip() == "the answer is"
    assert tokenizer.decode(tokenizer("the answer is").input_ids) == "the answer is"


def test_the_model_is_a_one_output_llama_classifier_on_that_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    out = build_tiny_llama_rm(tmp_path / "rm")
    cfg = json.loads((out / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (cfg["architectures"], cfg["model_type"]) == (["LlamaForSequenceClassification"], "llama")
    assert len(cfg["id2label"]) == 1 and cfg["pad_token_id"] == tokenizer.pad_token_id == 0
    assert cfg["vocab_size"] == len(tokenizer) and cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    assert cfg["max_position_embeddings"] == 1024


def test_a_rebuild_with_the_same_spec_reuses_the_directory_and_another_spec_rebuilds(tmp_path):
    out = build_tiny_llama_rm(tmp_path / "rm")
    weights = (out / "model.safetensors").read_bytes()
    before = (out / "model.safetensors").stat().st_mtime_ns
    build_tiny_llama_rm(tmp_path / "rm")
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    build_tiny_llama_rm(tmp_path / "rm", TinyLlamaRMSpec(head_std=1.0))
    assert (out / "model.safetensors").read_bytes() != weights
