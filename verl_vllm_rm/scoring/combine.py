"""Combine the reward-model score with verl's verifiable reward (``compute_score``).

- ``replace``: the RM score alone (``compute_score`` is not called);
- ``add``: rm + verifiable;
- ``multiply``: rm * verifiable (e.g. a 0/1 correctness gate on the RM score);
- ``weighted``: alpha * rm + (1 - alpha) * verifiable.
"""

from __future__ import annotations

from typing import Any


def combine(mode: str, rm: float, verifiable: float | None, alpha: float) -> float:
    if mode == "replace":
        return rm
    if verifiable is None:
        raise ValueError(f"combine={mode!r} needs a verifiable score")
    if mode == "add":
        return rm + verifiable
    if mode == "multiply":
        return rm * verifiable
    if mode == "weighted":
        return alpha * rm + (1.0 - alpha) * verifiable
    raise ValueError(f"unknown combine mode {mode!r}; use replace, add, multiply or weighted")


def split_verifiable(result: Any) -> tuple[float, dict[str, float]]:
    """``compute_score`` returns a number or a dict with ``score`` and extra fields."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"compute_score returned a dict without 'score': {sorted(result)}")
        extras = {f"verifiable_{k}": v for k, v in result.items() if k != "score"}
        return float(result["score"]), extras
    return float(result), {}
