"""Format reward (``rewards/format.py``): ordered tag blocks, custom regex, clear errors, and where it agrees with
rm-gallery's ``reasoning_format``."""

from __future__ import annotations

import re

import numpy as np
import pytest

from verl_vllm_rm.rewards import format_reward

CASES = [
    ("<think>reason</think><answer>42</answer>", 1.0),
    ("<think></think><answer></answer>", 1.0),
    ("\n<think>\nlines\n</think>\n\n<answer>\nyes\n</answer>\n", 1.0),
    ("preamble <think>x</think> middle <answer>y</answer> trailer", 1.0),
    ("<think>数学推理🙂</think><answer>四 🎉</answer>", 1.0),
    ("", 0.0),
    ("plain answer", 0.0),
    ("<think>never closed <answer>y</answer>", 0.0),
    ("<think>x</think> untagged answer", 0.0),
    ("<answer>y</answer><think>x</think>", 0.0),  # answer before the think block
    ("<think>x <answer>y</answer></think>", 0.0),  # answer nested in the thought
    ("</think><answer>y</answer>", 0.0),  # no open tag
    ("<THINK>x</THINK><ANSWER>y</ANSWER>", 0.0),  # tags are case-sensitive
]


@pytest.mark.parametrize("text, expected", CASES)
def test_default_think_then_answer(text, expected):
    assert format_reward([text])[0] == expected


def test_blocks_check_equals_the_lazy_regex_it_replaces(corpus):
    regex = re.compile(r"<think>.*?</think>.*?<answer>.*?</answer>", re.DOTALL)
    texts = corpus + [t for t, _ in CASES]
    expected = [float(regex.search(t) is not None) for t in texts]
    np.testing.assert_array_equal(format_reward(texts), expected)
    assert 0 < sum(expected) < len(expected)


def test_custom_blocks():
    texts = ["<reasoning>r</reasoning><code>c</code><answer>a</answer>", "<reasoning>r</reasoning><answer>a</answer>"]
    np.testing.assert_array_equal(format_reward(texts, blocks=["reasoning", "code", "answer"]), [1.0, 0.0])
    np.testing.assert_array_equal(format_reward(texts, blocks=["reasoning"]), [1.0, 1.0])


def test_pattern_replaces_blocks():
    texts = ["opened in the prompt</think>  It is 4.", "thinking</think>   ", "<think>x</think><answer>y</answer>"]
    np.testing.assert_array_equal(format_reward(texts, pattern=r"</think>\s*\S"), [1.0, 0.0, 1.0])
    strict = r"^<think>.*?</think>\s*<answer>.*?</answer>\s*$"
    texts = ["<think>x</think><answer>y</answer>", "hi <think>x</think><answer>y</answer>"]
    np.testing.assert_array_equal(format_reward(texts, pattern=strict), [1.0, 0.0])


def test_returns_float_array_for_an_empty_batch():
    out = format_reward([])
    assert out.dtype == np.float64 and out.shape == (0,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"pattern": "<think>(.*"}, "not a valid regular expression"),
        ({"blocks": []}, "non-empty list of tag names"),
        ({"blocks": "think"}, "non-empty list of tag names"),
        ({"blocks": None}, "non-empty list of tag names"),
        ({"blocks": 5}, "non-empty list of tag names"),
        ({"blocks": ["<think>"]}, "without brackets"),
        ({"blocks": ["think", ""]}, "non-empty list of tag names"),
    ],
)
def test_bad_parameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        format_reward(["x"], **kwargs)


def test_format_agrees_except_when_the_answer_does_not_follow_the_thought(corpus, gallery_results):
    theirs = np.array([score for score, _ in gallery_results("reasoning_format", corpus)])
    ours = format_reward(corpus)
    differ = [corpus[i] for i in np.flatnonzero(ours != theirs)]
    assert differ == [
        "<answer>answer first</answer> then <think>thinking</think>",
        "<think>outer <answer>nested</answer> still thinking</think>",
    ]
    agree = ours == theirs
    assert set(ours[agree]) == {0.0, 1.0}
