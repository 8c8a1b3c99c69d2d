"""The probe text (``parity/corpus.py``): arithmetic questions with their right answers, filler words, a step tag;
the same lines for the same seed."""

from __future__ import annotations

import re

from verl_vllm_rm.parity.corpus import STEP, synthetic_corpus

LINE = re.compile(r"What is (\d+) ([-+*]) (\d+)\? <think>([a-z ]+)</think> The answer is (-?\d+)\. <step>")


def test_each_line_is_a_question_its_right_answer_and_a_step_tag():
    lines = synthetic_corpus(n_lines=200, seed=3)
    assert len(lines) == 200 and STEP == "<step>"
    ops = set()
    for line in lines:
        match = LINE.fullmatch(line)
        assert match, line
        a, op, b, words, answer = match.groups()
        a, b, answer = int(a), int(b), int(answer)
        assert 0 <= a <= 999 and 0 <= b <= 999
        assert answer == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert 3 <= len(words.split()) <= 12
        ops.add(op)
    assert ops == {"+", "-", "*"}


def test_the_same_seed_gives_the_same_lines_and_another_seed_others():
    assert synthetic_corpus(n_lines=20, seed=1) == synthetic_corpus(n_lines=20, seed=1)
    assert synthetic_corpus(n_lines=20, seed=1) != synthetic_corpus(n_lines=20, seed=2)
    assert synthetic_corpus(n_lines=5, seed=1) == synthetic_corpus(n_lines=20, seed=1)[:5]  # a prefix of a longer run
    assert synthetic_corpus(n_lines=0) == []
