"""The tiny policy built on a reward model's tokenizer (``dev/tiny_policy.py``): the RM's token ids, a plain chat
template where the RM has none, an EOS to stop at, the model type verl's agent loop expects, and its warm-up
examples (a chat prompt, one answer of the tiny task, EOS)."""

from __future__ import annotations

import random

import pytest

from verl_vllm_rm.dev.tiny_policy import (PLAIN_CHAT_TEMPLATE, SFTWarmUp, TinyPolicySpec, build_tiny_policy,
                                          policy_model_type, policy_tokenizer, sft_examples)
from verl_vllm_rm.dev.tiny_task import MAX_OPERAND, good_answer


def test_policy_on_an_rm_tokenizer_without_chat_template(tmp_path, tiny_rm):
    """input_format=token_ids needs the RM's ids: the policy keeps its tokenizer, adding a plain template."""
    from transformers import AutoTokenizer

    rm_dir = tmp_path / "rm"
    tokenizer = AutoTokenizer.from_pretrained(tiny_rm)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(rm_dir)
    (rm_dir / "chat_template.jinja").unlink(missing_ok=True)
    from verl_vllm_rm.dev.tiny_policy import SFTWarmUp, TinyPolicySpec

    out = build_tiny_policy(rm_dir, tmp_path / "policy", TinyPolicySpec(sft=SFTWarmUp(steps=2)))
    policy_tok = AutoTokenizer.from_pretrained(out)
    assert policy_tok.chat_template == PLAIN_CHAT_TEMPLATE
    assert policy_tok("The answer is 7. #### 7").input_ids == tokenizer("The answer is 7. #### 7").input_ids


def rm_tokenizer_without(tiny_rm, tmp_path, token: str):
    """The tiny RM's tokenizer saved without its ``token`` (``eos_token``, ``pad_token``); returns its directory."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_rm)
    setattr(tokenizer, token, None)
    tokenizer.save_pretrained(tmp_path / "rm")
    return tmp_path / "rm"


def test_an_rm_tokenizer_without_eos_is_refused_naming_the_setting(tiny_rm, tmp_path):
    rm_dir = rm_tokenizer_without(tiny_rm, tmp_path, "eos_token")
    with pytest.raises(ValueError, match=rf"the tokenizer in {rm_dir} has no EOS token; the policy needs one to stop "
                                         r"generating: set eos_token in its tokenizer_config.json, or give an RM "
                                         r"whose tokenizer has one"):
        policy_tokenizer(rm_dir)


def test_a_tokenizer_without_a_pad_token_pads_with_its_eos(tiny_rm, tmp_path):
    policy_tok = policy_tokenizer(rm_tokenizer_without(tiny_rm, tmp_path, "pad_token"))
    assert policy_tok.pad_token == policy_tok.eos_token == "<|endoftext|>"
    assert policy_tokenizer(tiny_rm).pad_token == "<|pad|>"  # a pad token of its own is kept


def test_a_chatml_tokenizer_is_qwen2_to_verl_and_any_other_is_llama(tiny_rm, tmp_path):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    assert policy_model_type(policy_tokenizer(tiny_rm)) == "qwen2"
    words = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "</s>": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    assert policy_model_type(PreTrainedTokenizerFast(tokenizer_object=words, eos_token="</s>")) == "llama"


def test_each_warm_up_example_is_a_chat_prompt_one_answer_and_eos(tiny_rm):
    tokenizer = policy_tokenizer(tiny_rm)
    examples = sft_examples(tokenizer, 12, random.Random(0))
    assert len(examples) == 12
    styles = set()
    for ids, prompt_len in examples:
        prompt = tokenizer.decode(ids[:prompt_len])
        assert prompt.startswith("<|im_start|>user\nWhat is ") and prompt.endswith("<|im_start|>assistant\n")
        a, b = (int(n) for n in prompt.split("What is ")[1].split("?")[0].split(" + "))
        assert 0 <= a <= MAX_OPERAND and 0 <= b <= MAX_OPERAND
        assert ids[-1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in ids[prompt_len:-1]
        answer = tokenizer.decode(ids[prompt_len:-1])
        styles.add("good" if answer == good_answer(a, b) else "think" if "<think>" in answer
                   else "plain" if answer == f" The answer is {a + b}." else "so" if answer.startswith(" so ")
                   else answer)
    assert styles == {"good", "think", "plain", "so"}, styles  # all four styles of the task, nothing else


def test_the_policy_is_a_causal_lm_on_the_rms_vocabulary_that_stops_at_its_eos(tiny_rm, tmp_path):
    import json

    out = build_tiny_policy(tiny_rm, tmp_path / "policy", TinyPolicySpec(sft=SFTWarmUp(steps=2)))
    config = json.loads((out / "config.json").read_text())
    tokenizer = policy_tokenizer(tiny_rm)
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert (config["hidden_size"], config["intermediate_size"], config["tie_word_embeddings"]) == (64, 128, False)
    assert config["vocab_size"] >= len(tokenizer)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tokenizer.eos_token_id
