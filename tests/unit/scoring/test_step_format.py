"""``scoring/step_format.py`` over a real tokenizer, no server: a policy's plain-text steps rendered as the cards
write them (the texts the cards' code builds, written out here), the format ``auto`` takes from each served head,
and the options refused with their fix. The scores against the cards' recipes are
``tests/integration/server/test_model_families.py``'s."""

from __future__ import annotations

import re

import pytest

from verl_vllm_rm.options import build
from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape
from verl_vllm_rm.scoring.options import RewardModelOptions
from verl_vllm_rm.scoring.step_format import (QWEN_PRM_SYSTEM_PROMPT, math_shepherd_ids, qwen_prm_ids,
                                              resolve_step_format, split_steps, step_end_tokens, step_spans,
                                              with_system_prompt)

TAG = "<step>"


def test_steps_are_the_text_between_separators_kept_as_written_and_blank_ones_dropped():
    assert split_steps("step one\n\n  step two \n\n\n\nanswer\n\n", "\n\n") == ["step one", "  step two ", "answer"]
    assert split_steps(" \n\n\t\n\n", "\n\n") == []
    assert split_steps("a\nb", "\n\n") == ["a\nb"]


def test_each_step_maps_to_the_policy_token_that_ends_it(tokenizer):
    """Through the decoded text: the token whose prefix first covers the step's last character, whatever the
    tokenizer merged across the separator."""
    text = "Add 3 and 4.\n\nThat makes 7.\n\n\n\nThe answer is 7."
    ids = tokenizer(text, add_special_tokens=False).input_ids
    spans = step_spans(text, "\n\n")
    assert [text[a:b] for a, b in spans] == ["Add 3 and 4.", "That makes 7.", "The answer is 7."]
    ends = step_end_tokens(tokenizer, ids, [end for _, end in spans])
    assert ends[-1] == len(ids) - 1 and ends == sorted(ends)
    for k, (_, end) in zip(ends, spans):
        assert len(tokenizer.decode(ids[: k + 1])) >= end > len(tokenizer.decode(ids[:k])), (k, end)


def shape(kind: HeadKind, architecture: str, **kw) -> ModelShape:
    return ModelShape(kind, architecture, ("x",), "float32", "float32", **kw)


@pytest.mark.parametrize(("option", "served", "want"), [
    ("auto", shape(HeadKind.STEP_CLASSIFIER, "Qwen2ForProcessRewardModel", step_tag_id=5), "qwen_prm"),
    ("auto", shape(HeadKind.STEP_TOKENS, "MistralForCausalLM", step_tag_id=5, step_tokens=(1, 2)), "math_shepherd"),
    ("auto", shape(HeadKind.SCALAR, "Qwen2ForSequenceClassification", step_tag_id=5), "tagged"),
    ("auto", None, "tagged"),
    ("math_shepherd", shape(HeadKind.STEP_CLASSIFIER, "Qwen2ForProcessRewardModel", step_tag_id=5), "math_shepherd"),
])
def test_auto_takes_the_served_heads_card_format(option, served, want):
    assert resolve_step_format(option, served) == want


def test_qwen_prm_is_the_cards_conversation(tokenizer):
    """The card: system, user question, the steps joined by the tag and one after the last as the assistant."""
    prompt, response = qwen_prm_ids(tokenizer, "What is 3 + 4?", ["a b", "c"], TAG, None)
    card = tokenizer.apply_chat_template([{"role": "system", "content": QWEN_PRM_SYSTEM_PROMPT},
                                          {"role": "user", "content": "What is 3 + 4?"},
                                          {"role": "assistant", "content": f"a b{TAG}c{TAG}"}], tokenize=False)
    assert prompt + response == tokenizer(card, add_special_tokens=False).input_ids
    assert response.count(tokenizer.convert_tokens_to_ids(TAG)) == 2 and TAG not in tokenizer.decode(prompt)
    own, _ = qwen_prm_ids(tokenizer, "q", ["a"], TAG, "Be brief.")
    assert "Be brief." in tokenizer.decode(own) and QWEN_PRM_SYSTEM_PROMPT not in tokenizer.decode(own)


def test_math_shepherd_is_the_question_then_one_tagged_step_per_line(tokenizer):
    prompt, response = math_shepherd_ids(tokenizer, "What is 3 + 4?", ["3 + 4 = 7", "The answer is 7"], TAG)
    assert prompt + response == tokenizer(f"What is 3 + 4? 3 + 4 = 7 {TAG}\nThe answer is 7 {TAG}").input_ids
    assert prompt == tokenizer("What is 3 + 4?").input_ids


def test_the_rms_system_prompt_replaces_the_chats_own_and_leaves_the_rest():
    chat = [{"role": "system", "content": "policy's"}, {"role": "user", "content": "q"}]
    assert with_system_prompt(chat, "rm's") == [{"role": "system", "content": "rm's"}, chat[1]]
    assert with_system_prompt(chat[1:], "rm's") == [{"role": "system", "content": "rm's"}, chat[1]]
    assert with_system_prompt(chat, None) == chat


@pytest.mark.parametrize(("options", "message"), [
    ({"step_format": "qwen_prm"}, "reward model 'rm': step_format and step_split say how a process reward model "
                                  "reads the response's steps, and step_reward is none: set step_reward (min, last, "
                                  "mean, prod, token) or drop them"),
    ({"step_reward": "min", "step_split": ""}, "reward model 'rm': step_split is empty: give the text that ends a "
                                               "step (e.g. a blank line)"),
    ({"system_prompt": "Be brief."}, "reward model 'rm': system_prompt goes into a conversation rendered with the "
                                     "RM's chat template, and this RM reads the policy's own ids "
                                     "(input_format=token_ids): set input_format=chat_template (with "
                                     "rm_tokenizer_path) or drop system_prompt"),
])
def test_step_options_that_would_do_nothing_or_the_wrong_thing_are_refused(options, message):
    with pytest.raises(ValueError, match=f"^{re.escape(f'reward_kwargs: {message}')}$"):
        build(RewardModelOptions, options, "reward_kwargs")
