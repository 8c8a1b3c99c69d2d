"""Deterministic probe text: arithmetic questions, answers and filler prose.

The parity check scores it on the server and in transformers; the tiny RM's
tokenizer is trained on it, so tests and probes speak the same words.
"""

from __future__ import annotations

import random

STEP = "<step>"  # a special token of the tiny RM (process-reward step tag); plain text to other tokenizers

_WORDS = (
    "the answer is think step first then so we add subtract multiply result total number "
    "question please compute what sum of and plus minus times equals check final because "
    "therefore good bad correct wrong helpful honest harmless reason explain"
).split()


def synthetic_corpus(n_lines: int = 3000, seed: int = 0) -> list[str]:
    """Arithmetic questions, answers and filler prose; deterministic for a seed."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op, val = rng.choice([("+", a + b), ("-", a - b), ("*", a * b)])
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        lines.append(f"What is {a} {op} {b}? <think>{words}</think> The answer is {val}. {STEP}")
    return lines
