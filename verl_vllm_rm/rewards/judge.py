"""A generative judge's part of the reward, as plain functions (no HTTP here).

The prompt a judge reads, the constraint its answer is generated under (vLLM's structured
output, the request's ``structured_outputs`` field: a JSON schema, or for a ranking a
grammar that admits only permutations), the strict reading of that answer, and the
verdicts turned into one score per response. Three modes:

* ``pointwise``: one response, an integer score 1-10;
* ``pairwise``: two responses (or a response and the reference answer), ``A``, ``B`` or ``tie``;
* ``listwise``: every response of a prompt group at once, a ranking best first.

An answer that does not read as its schema says is a :class:`JudgeAnswerError`: never a
default score, a tie or the natural order (what rm-gallery 0.1.7 falls back to).

Scores are on rm-gallery's scale where the modes overlap, so the two agree on the same
parsed answers: a ranking maps to ``1 - 2 * position / (n - 1)``; pairwise verdicts among
the members of a group aggregate by ``winrate`` (wins / comparisons, min-max to [-1, 1]),
``copeland`` (wins - losses over the largest absolute net) or ``elo`` (ratings from 1500,
K=32, updated over all verdicts until no rating moves by 0.01, min-max to [-1, 1]).
"""

from __future__ import annotations

import json
import string
from typing import Literal, Mapping, Sequence

import numpy as np

JudgeMode = Literal["pointwise", "pairwise", "listwise"]
JUDGE_MODES: tuple[str, ...] = ("pointwise", "pairwise", "listwise")
Aggregation = Literal["winrate", "copeland", "elo"]
AGGREGATIONS: tuple[str, ...] = ("winrate", "copeland", "elo")
Verdict = Literal["A", "B", "tie"]

DEFAULT_PRINCIPLES: tuple[str, ...] = (
    "Helpfulness: the response does what the user asked, completely and correctly.",
    "Harmlessness: the response does not help cause harm and declines unsafe requests.",
    "Honesty: the response states only what it can support and says when it is unsure.",
)

#: ``str.format`` templates; ``{principles}`` is the numbered list, ``{responses}`` the labelled responses
DEFAULT_TEMPLATES: Mapping[str, str] = {
    "pointwise": (
        "You judge one response to a user's request by these principles:\n{principles}\n\n"
        "# Request\n{prompt}\n\n# Response\n{responses}\n\n"
        'Answer with JSON {{"score": <integer 1-10>}}, 10 for a response that meets every principle.'
    ),
    "pairwise": (
        "You compare two responses to a user's request by these principles:\n{principles}\n\n"
        "# Request\n{prompt}\n\n{responses}\n\n"
        'Answer with JSON {{"winner": "A"}}, {{"winner": "B"}} or {{"winner": "tie"}}.'
    ),
    "listwise": (
        "You rank {n} responses to a user's request by these principles:\n{principles}\n\n"
        "# Request\n{prompt}\n\n{responses}\n\n"
        'Answer with JSON {{"ranking": [...]}}: the {n} response numbers, best first, each once.'
    ),
}
_FIELDS = {"pointwise": {"principles", "prompt", "responses"}, "pairwise": {"principles", "prompt", "responses"},
           "listwise": {"principles", "prompt", "responses", "n"}}


class JudgeAnswerError(ValueError):
    """The judge's answer does not read as its schema says (the failure policy decides what happens)."""


def check_template(mode: str, template: str) -> None:
    """A template uses ``{prompt}`` and ``{responses}`` (and may use ``{principles}``, ``{n}`` listwise)."""
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    unknown, missing = fields - _FIELDS[mode], {"prompt", "responses"} - fields
    if unknown or missing:
        raise ValueError(f"judge template for mode {mode!r} must use {{prompt}} and {{responses}} and may use "
                         f"{sorted(_FIELDS[mode] - {'prompt', 'responses'})}; unknown {sorted(unknown)}, "
                         f"missing {sorted(missing)}")


#: the most responses one listwise judgement ranks: its grammar has a rule per subset of responses (2^n)
MAX_LISTWISE = 12


def answer_constraint(mode: JudgeMode, n: int = 2) -> dict:
    """vLLM's ``structured_outputs`` for the answer: the mode's JSON schema, or for a listwise ranking a grammar
    whose every sentence is a permutation of 1..n (a JSON schema cannot say "each once" inside xgrammar's subset,
    and a small judge then repeats numbers)."""
    if mode != "listwise":
        return {"json": answer_schema(mode, n)}
    if not 2 <= n <= MAX_LISTWISE:
        raise ValueError(f"a listwise judgement ranks 2 to {MAX_LISTWISE} responses, got {n}: its grammar grows "
                         "as 2^n; use mode pairwise or pointwise for larger groups")
    return {"grammar": permutation_grammar(n)}


def permutation_grammar(n: int) -> str:
    """EBNF (xgrammar's, also llguidance's) for ``{"ranking":[...]}`` holding each of 1..n once: rule ``rM`` follows
    the numbers already written (the bits of ``M``) and offers only the others."""
    full = (1 << n) - 1
    first = " | ".join(f'"{k + 1}" r{1 << k}' for k in range(n))
    rules = [f'root ::= "{{\\"ranking\\":[" ( {first} ) "]}}"']
    for used in range(1, full):
        rules.append(f"r{used} ::= " + " | ".join(f'",{k + 1}" r{used | 1 << k}' for k in range(n)
                                                   if not used & 1 << k))
    rules.append(f'r{full} ::= ""')
    return "\n".join(rules)


def answer_schema(mode: JudgeMode, n: int = 2) -> dict:
    """The JSON schema the judge's answer is constrained to (within xgrammar's subset: no ``uniqueItems``,
    so a listwise ranking's being a permutation is checked by :func:`parse_answer`)."""
    if mode == "pointwise":
        properties: dict = {"score": {"type": "integer", "minimum": 1, "maximum": 10}}
    elif mode == "pairwise":
        properties = {"winner": {"type": "string", "enum": ["A", "B", "tie"]}}
    elif mode == "listwise":
        properties = {"ranking": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": n},
                                  "minItems": n, "maxItems": n}}
    else:
        raise ValueError(f"judge mode {mode!r} is not one of {list(JUDGE_MODES)}")
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def render_prompt(mode: JudgeMode, template: str, principles: Sequence[str], prompt: str,
                  responses: Sequence[str]) -> str:
    """The judge's prompt: one response (pointwise), two labelled A and B (pairwise), or n numbered 1..n."""
    expected = {"pointwise": 1, "pairwise": 2}.get(mode)
    if expected is not None and len(responses) != expected:
        raise ValueError(f"a {mode} judgement takes {expected} response(s), got {len(responses)}")
    if mode == "pointwise":
        shown = responses[0]
    elif mode == "pairwise":
        shown = f"# Response A\n{responses[0]}\n\n# Response B\n{responses[1]}"
    else:
        shown = "\n\n".join(f"# Response {i}\n{r}" for i, r in enumerate(responses, start=1))
    listed = "\n".join(f"{i}. {p}" for i, p in enumerate(principles, start=1))
    return template.format(principles=listed, prompt=prompt, responses=shown, n=len(responses))


def parse_answer(mode: JudgeMode, text: str, n: int = 2) -> int | Verdict | list[int]:
    """The answer's value: a score 1-10, a verdict, or a ranking as 0-based response indices, best first."""
    try:
        answer = json.loads(text)
    except ValueError:
        raise JudgeAnswerError(f"the {mode} judge's answer is not JSON: {text[:200]!r}") from None
    key = {"pointwise": "score", "pairwise": "winner", "listwise": "ranking"}[mode]
    if not isinstance(answer, dict) or key not in answer:
        raise JudgeAnswerError(f"the {mode} judge's answer has no {key!r}: {text[:200]!r}")
    value = answer[key]
    if mode == "pointwise":
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10:
            raise JudgeAnswerError(f"the pointwise judge's score must be an integer 1-10, got {value!r}")
        return value
    if mode == "pairwise":
        if value not in ("A", "B", "tie"):
            raise JudgeAnswerError(f"the pairwise judge's winner must be 'A', 'B' or 'tie', got {value!r}")
        return value
    if not isinstance(value, list) or sorted(v for v in value if isinstance(v, int)) != list(range(1, n + 1)) \
            or any(isinstance(v, bool) for v in value):
        raise JudgeAnswerError(f"the listwise judge's ranking must hold each of 1..{n} once, got {value!r}")
    return [v - 1 for v in value]


def ranking_scores(ranking: Sequence[int]) -> list[float]:
    """Scores in [-1, 1] from a ranking of 0-based indices (best first): ``1 - 2 * position / (n - 1)``."""
    n = len(ranking)
    scores = [0.0] * n
    for position, index in enumerate(ranking):
        scores[index] = 1.0 - 2.0 * position / (n - 1) if n > 1 else 0.0
    return scores


def pointwise_scores(raw: Sequence[int]) -> list[float]:
    """A group's 1-10 scores min-max scaled to [-1, 1] (all equal: all 0), rm-gallery's pointwise scale."""
    return _min_max(np.asarray(raw, dtype=np.float64))


def pairwise_scores(n: int, verdicts: Mapping[tuple[int, int], Verdict], method: Aggregation) -> list[float]:
    """Scores in [-1, 1] of ``n`` responses from verdicts on pairs ``(i, j)`` (``"A"``: i won, ``"B"``: j won)."""
    pairs = np.array(list(verdicts), dtype=np.int64).reshape(-1, 2)
    result_i = np.array([{"A": 1.0, "B": 0.0, "tie": 0.5}[v] for v in verdicts.values()])  # i's result
    i, j = pairs[:, 0], pairs[:, 1]
    if method == "winrate":
        wins = np.bincount(i, weights=result_i == 1.0, minlength=n) + np.bincount(j, weights=result_i == 0.0, minlength=n)
        total = np.bincount(i, minlength=n) + np.bincount(j, minlength=n)
        return _min_max(np.where(total > 0, wins / np.maximum(total, 1), 0.5))
    if method == "copeland":  # +1 a win, -1 a loss, 0 a tie
        net = np.bincount(i, weights=np.sign(result_i - 0.5), minlength=n) + \
            np.bincount(j, weights=np.sign(0.5 - result_i), minlength=n)
        top = np.abs(net).max(initial=0.0)
        return [0.0] * n if top < 1e-6 else (net / top).tolist()
    if method == "elo":
        return _min_max(_elo(n, i.tolist(), j.tolist(), result_i.tolist()))
    raise ValueError(f"pairwise aggregation {method!r} is not one of {list(AGGREGATIONS)}")


def _elo(n: int, i: list[int], j: list[int], result_i: list[float], k: float = 32.0, threshold: float = 0.01,
         max_rounds: int = 100) -> np.ndarray:
    """Elo ratings from 1500, every verdict applied in order each round, until no rating moves by ``threshold``."""
    ratings = [1500.0] * n
    for _ in range(max_rounds):
        before = list(ratings)
        for a, b, s in zip(i, j, result_i):
            expected = 1.0 / (1.0 + 10.0 ** ((ratings[b] - ratings[a]) / 400.0))
            ratings[a] += k * (s - expected)
            ratings[b] += k * ((1.0 - s) - (1.0 - expected))
        if max(abs(x - y) for x, y in zip(ratings, before)) < threshold:
            break
    return np.asarray(ratings)


def _min_max(values: np.ndarray) -> list[float]:
    low, high = float(values.min()), float(values.max())
    if high - low < 1e-6:
        return [0.0] * len(values)
    return (2.0 * (values - low) / (high - low) - 1.0).tolist()
