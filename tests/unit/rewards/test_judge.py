"""The judge's prompt, answer schema, strict parsing and aggregation (pure; the judge server's tests are elsewhere)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from verl_vllm_rm.rewards.judge import (
    DEFAULT_PRINCIPLES,
    DEFAULT_TEMPLATES,
    JudgeAnswerError,
    answer_schema,
    check_template,
    pairwise_scores,
    parse_answer,
    pointwise_scores,
    ranking_scores,
    render_prompt,
)


def test_schemas_stay_inside_what_xgrammar_compiles():
    for mode in ("pointwise", "pairwise", "listwise"):
        schema = answer_schema(mode, n=4)
        assert schema["additionalProperties"] is False and schema["required"] == list(schema["properties"])
        assert "uniqueItems" not in json.dumps(schema)  # xgrammar rejects it; vLLM would switch backend
    ranking = answer_schema("listwise", n=4)["properties"]["ranking"]
    assert (ranking["minItems"], ranking["maxItems"], ranking["items"]["maximum"]) == (4, 4, 4)
    with pytest.raises(ValueError, match="not one of"):
        answer_schema("groupwise")


@pytest.mark.parametrize(("mode", "text", "n", "value"), [
    ("pointwise", '{"score": 7}', 1, 7),
    ("pairwise", '{"winner": "tie"}', 2, "tie"),
    ("listwise", '{"ranking": [3, 1, 2]}', 3, [2, 0, 1]),
])
def test_a_valid_answer_reads_as_its_value(mode, text, n, value):
    assert parse_answer(mode, text, n) == value


@pytest.mark.parametrize(("mode", "text", "n", "message"), [
    ("pointwise", "7", 1, "the pointwise judge's answer has no 'score': '7'"),
    ("pointwise", "{score: 7", 1, "the pointwise judge's answer is not JSON: '{score: 7'"),
    ("pointwise", '{"score": 11}', 1, "integer 1-10"),
    ("pointwise", '{"score": 7.5}', 1, "integer 1-10"),
    ("pointwise", '{"score": true}', 1, "integer 1-10"),
    ("pairwise", '{"winner": "C"}', 2, "the pairwise judge's winner must be 'A', 'B' or 'tie', got 'C'"),
    ("pairwise", '{"verdict": "A"}', 2, "the pairwise judge's answer has no 'winner'"),
    ("listwise", '{"ranking": [1, 1, 2]}', 3,
     r"the listwise judge's ranking must hold each of 1\.\.3 once, got \[1, 1, 2\]"),
    ("listwise", '{"ranking": [1, 2]}', 3, "each of 1..3 once"),
    ("listwise", '{"ranking": [0, 1, 2]}', 3, "each of 1..3 once"),
    ("listwise", '{"ranking": [1, true, 3]}', 3, "each of 1..3 once"),
    ("listwise", '{"ranking": "1,2,3"}', 3, "each of 1..3 once"),
])
def test_an_answer_off_its_schema_is_an_error_never_a_default(mode, text, n, message):
    with pytest.raises(JudgeAnswerError, match=message):
        parse_answer(mode, text, n)


def test_prompts_show_the_principles_and_label_the_responses():
    pair = render_prompt("pairwise", DEFAULT_TEMPLATES["pairwise"], DEFAULT_PRINCIPLES, "Add 2 and 2.", ["4", "5"])
    assert "1. Helpfulness" in pair and "3. Honesty" in pair
    assert pair.index("# Response A\n4") < pair.index("# Response B\n5")
    listed = render_prompt("listwise", DEFAULT_TEMPLATES["listwise"], ["Be right."], "Q?", ["x", "y", "z"])
    assert "# Response 3\nz" in listed and "the 3 response numbers" in listed
    with pytest.raises(ValueError, match=r"a pairwise judgement takes 2 response\(s\), got 1"):
        render_prompt("pairwise", DEFAULT_TEMPLATES["pairwise"], [], "Q?", ["only one"])
    for mode, template in DEFAULT_TEMPLATES.items():
        check_template(mode, template)
    with pytest.raises(ValueError, match=r"unknown \['answer'\].*missing \['responses'\]"):
        check_template("pairwise", "{prompt} {answer}")


def test_ranking_scores_spread_best_to_worst_over_minus_one_to_one():
    assert ranking_scores([2, 0, 1]) == [0.0, -1.0, 1.0]
    assert ranking_scores([0]) == [0.0]
    assert pointwise_scores([3, 9, 6]) == [-1.0, 1.0, 0.0]
    assert pointwise_scores([5, 5]) == [0.0, 0.0]


def _gallery_evaluators():
    from rm_gallery.gallery.evaluation.llm_judge.evaluators.listwise import ListwiseEvaluator
    from rm_gallery.gallery.evaluation.llm_judge.evaluators.pairwise import PairwiseEvaluator

    return PairwiseEvaluator(llm=None, template=None), ListwiseEvaluator(llm=None)


@pytest.mark.parametrize("method", ["winrate", "copeland", "elo"])
def test_pairwise_aggregation_agrees_with_rm_gallery_on_the_same_verdicts(method):
    """rm-gallery's own aggregation code (its evaluators need no LLM for it) on the same parsed verdicts."""
    pairwise, _ = _gallery_evaluators()
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 8):
        for _ in range(20):
            verdicts = {(i, j): rng.choice(["A", "B", "tie"]) for i, j in itertools.combinations(range(n), 2)}
            comparisons = [{"i": i, "j": j, "winner": {"A": i, "B": j, "tie": -1}[v]} for (i, j), v in verdicts.items()]
            theirs, _ = getattr(pairwise, f"_calculate_{method}_scores")(comparisons, n)
            np.testing.assert_allclose(pairwise_scores(n, verdicts, method), theirs, atol=1e-9)
    with pytest.raises(ValueError, match="not one of"):
        pairwise_scores(2, {(0, 1): "A"}, "bradley_terry")


def test_ranking_scores_agree_with_rm_gallery():
    _, listwise = _gallery_evaluators()
    rng = np.random.default_rng(1)
    for n in (1, 2, 4, 8):
        ranking = rng.permutation(n).tolist()
        assert ranking_scores(ranking) == pytest.approx(listwise._ranking_to_scores(ranking, n))


def grammar_language(grammar: str) -> set[str]:
    """Every sentence of a grammar made of rules ``name ::= alt | alt`` whose alternatives are a quoted literal
    followed by at most one rule name (the root's alternatives in one parenthesised group between literals)."""
    import re

    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    head, group, tail = re.fullmatch(r'(".*?") \( (.*) \) (".*")', rules.pop("root")).groups()

    def expand(alternatives: str) -> set[str]:
        out = set()
        for alt in alternatives.split(" | "):
            literal, name = re.fullmatch(r'("(?:[^"\\]|\\.)*")(?: (\w+))?', alt).groups()
            out |= {json.loads(literal) + s for s in (expand(rules[name]) if name else {""})}
        return out

    return {json.loads(head) + s + json.loads(tail) for s in expand(group)}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_listwise_grammar_admits_exactly_the_permutations(n):
    from itertools import permutations

    from verl_vllm_rm.rewards.judge import permutation_grammar

    expected = {json.dumps({"ranking": list(p)}, separators=(",", ":")) for p in permutations(range(1, n + 1))}
    assert grammar_language(permutation_grammar(n)) == expected


def test_answer_constraints_by_mode():
    from verl_vllm_rm.rewards.judge import MAX_LISTWISE, answer_constraint, answer_schema

    assert answer_constraint("pointwise", 1) == {"json": answer_schema("pointwise", 1)}
    assert answer_constraint("pairwise") == {"json": answer_schema("pairwise")}
    assert set(answer_constraint("listwise", MAX_LISTWISE)) == {"grammar"}
    for n in (1, MAX_LISTWISE + 1):
        with pytest.raises(ValueError, match=f"a listwise judgement ranks 2 to {MAX_LISTWISE} responses, got {n}"):
            answer_constraint("listwise", n)
