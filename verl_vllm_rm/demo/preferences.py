"""A synthetic preference task the tiny RM can learn in about a minute on CPU.

Prompts ask for a small sum. The preferred answer reasons in a ``<think>`` block
and states the correct result; rejected answers get the arithmetic wrong, skip the
think block, or ramble. After training, the RM's scores mean something: correct,
well-formed answers score higher than the rest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    prompt: str
    chosen: str
    rejected: str


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}? Please compute the sum."


def good_answer(a: int, b: int) -> str:
    return f" <think>add {a} and {b}</think> The answer is {a + b}."


def bad_answers(a: int, b: int, rng: random.Random) -> list[str]:
    wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3, 10])
    return [
        f" <think>add {a} and {b}</think> The answer is {wrong}.",
        f" The answer is {a + b}.",
        f" <think>{'so ' * rng.randint(4, 10)}</think> so so so so so",
    ]


def preference_pairs(n: int, seed: int = 0, max_operand: int = 20) -> list[Pair]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        pairs.append(Pair(question(a, b), good_answer(a, b), rng.choice(bad_answers(a, b, rng))))
    return pairs
