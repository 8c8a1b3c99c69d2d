"""The tiny Math-Shepherd-kind PRM (``dev/tiny_math_shepherd.py``), built offline here (under a second): its
tokenizer reads the published card's recipe as the published one does (``encode("+ -")[1:]`` are the pieces
``▁+``/``▁-``, not the bare ``+``/``-``; ``encode("ки")[-1]`` is ``▁ки``; ``<s>`` prepended), on a Mistral causal
LM. (Served and scored by vLLM: tests/integration/server/test_model_families.py.)"""

from __future__ import annotations

import json

from verl_vllm_rm.dev.tiny_math_shepherd import (BAD, GOOD, STEP_TAG, TinyMathShepherdSpec, build_tiny_math_shepherd,
                                                 shepherd_corpus)


def test_the_corpus_is_steps_ending_in_the_step_tag_and_repeats_with_its_seed():
    lines = shepherd_corpus(n_lines=50, seed=3)
    assert lines == shepherd_corpus(n_lines=50, seed=3) and lines != shepherd_corpus(n_lines=50, seed=4)
    for line in lines:
        first, second = line.split("\n")
        question, step = first.split("? Step 1: ")
        a, op, b = question.removeprefix("What is ").split(" ")
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert step == f"{a} {op} {b} = {value} {STEP_TAG}" and second == f"Step 2: The answer is {value} {STEP_TAG}"


def test_the_cards_recipe_reads_the_metaspace_pieces_not_the_bare_signs(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_math_shepherd(tmp_path / "prm"))
    good, bad = tokenizer.encode(f"{GOOD} {BAD}")[1:]
    step = tokenizer.encode(STEP_TAG)[-1]
    assert tokenizer.convert_ids_to_tokens([good, bad, step]) == ["▁+", "▁-", "▁ки"]
    vocab = tokenizer.get_vocab()
    assert vocab[GOOD] not in (good, bad) and vocab[BAD] not in (good, bad)  # the bare signs: other rows
    assert tokenizer.encode("1 + 1")[0] == tokenizer.bos_token_id == vocab["<s>"]
    pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(f"= 7 {STEP_TAG}\nStep 2", add_special_tokens=False))
    assert pieces[pieces.index("▁ки") + 1] == "\n"  # a line break is a token of its own, as Mistral's <0x0A>


def test_the_model_is_a_mistral_causal_lm_on_that_vocabulary(tmp_path):
    out = build_tiny_math_shepherd(tmp_path / "prm")
    cfg = json.loads((out / "config.json").read_text())
    spec = TinyMathShepherdSpec()
    assert (cfg["architectures"], cfg["model_type"], cfg["sliding_window"]) == (["MistralForCausalLM"], "mistral", None)
    assert (cfg["hidden_size"], cfg["max_position_embeddings"], cfg["tie_word_embeddings"]) == (128, 512, False)
    assert cfg["vocab_size"] <= spec.vocab_size and cfg["hidden_size"] // cfg["num_attention_heads"] == 32
