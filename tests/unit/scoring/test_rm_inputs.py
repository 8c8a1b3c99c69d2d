"""The reward model's input built from a trajectory (``scoring/rm_inputs.py``), on the tiny RM's tokenizer: the
prompt part of a chat rendered with the RM's template, a rubric template filled in (checked, then tokenized in two
parts so truncation only removes text before the response), and the split at the ids two renderings share."""

from __future__ import annotations

import pytest

from verl_vllm_rm.scoring.rm_inputs import (
    check_rubric_template,
    chat_template_ids,
    rubric_template_ids,
    shared_prefix_split,
)


@pytest.mark.parametrize(("prompt", "full", "want"), [
    ([1, 2, 3], [1, 2, 3, 4, 5], ([1, 2, 3], [4, 5])),
    ([1, 2, 3], [1, 2, 9, 4, 5], ([1, 2], [9, 4, 5])),  # the boundary's tokens merged differently: response part
    ([7], [1, 2], ([], [1, 2])),
    ([1, 2, 3, 4], [1, 2], ([1, 2], [])),
    ([], [], ([], [])),
])
def test_the_prompt_part_is_what_the_full_rendering_shares_with_the_prompts_from_the_start(prompt, full, want):
    assert shared_prefix_split(prompt, full) == want


def test_a_chat_is_split_at_the_assistants_turn(tokenizer):
    messages = [{"role": "user", "content": "What is two plus two?"}]
    prompt_ids, response_ids = chat_template_ids(tokenizer, messages, "It is four.")
    assert tokenizer.decode(prompt_ids) == "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(response_ids) == "It is four.<|im_end|>\n"


@pytest.mark.parametrize("template", ["{prompt}{response}", "Q: {prompt}\n{principles}\nA: {response}\nend",
                                      "{response} answers {prompt}"])
def test_a_rubric_template_with_prompt_one_response_and_principles_is_accepted(template):
    check_rubric_template(template)


@pytest.mark.parametrize(("template", "found"), [
    ("{prompt} {response} {style}", "['prompt', 'response', 'style']"),
    ("{prompt} {response} {response}", "['prompt', 'response', 'response']"),
    ("{prompt} only", "['prompt']"),
    ("{response}", "['response']"),
])
def test_a_rubric_template_missing_a_field_or_with_an_unknown_one_is_refused(template, found):
    with pytest.raises(ValueError, match=r"rubric_template must use \{prompt\} and exactly one \{response\} \(and "
                                         r"optionally \{principles\}\); found fields " + found.replace("[", r"\[")):
        check_rubric_template(template)


def test_a_rubric_template_is_filled_in_and_tokenized_before_and_from_the_response(tokenizer):
    template = "Principles:\n{principles}\nQuestion: {prompt}\nAnswer: {response}\nIs it good?"
    before, after = rubric_template_ids(tokenizer, template, ["be brief", "be right"], "two plus {two}?",
                                        "four {response}")
    assert tokenizer.decode(before) == "Principles:\n- be brief\n- be right\nQuestion: two plus {two}?\nAnswer: "
    assert tokenizer.decode(after) == "four {response}\nIs it good?"  # a response's braces are text, not fields
    assert after == tokenizer("four {response}\nIs it good?", add_special_tokens=False).input_ids
