"""Pairwise comparison with the prompt's reference answer (validation win rates).

The reference answer of each prompt is scored once with the same reward model and
the same input format as the responses, cached by prompt, and never counted as a
sample. Each response then gets ``win`` (score > reference), ``win_and``
(score >= reference) and ``ref_margin`` (score - reference).
"""

from __future__ import annotations

from typing import Any, Hashable


class MissingReferenceError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def win_metrics(score: float, reference: float) -> dict[str, float]:
    return {"win": float(score > reference), "win_and": float(score >= reference), "ref_margin": score - reference}


NO_WIN_METRICS: dict[str, None] = {"win": None, "win_and": None, "ref_margin": None}  # verl's val metrics skip None


class ReferenceCache:
    """One reference score per (prompt group, reference text), shared by concurrent callers."""

    def __init__(self, max_entries: int = 8192) -> None:
        self._scores: dict[Hashable, Any] = {}
        self.max_entries = max_entries
        self.scored = 0

    async def score(self, key: Hashable, make_future) -> float:
        import asyncio

        if key not in self._scores:
            while len(self._scores) >= self.max_entries:  # oldest first (insertion order)
                self._scores.pop(next(iter(self._scores)))
            self._scores[key] = asyncio.ensure_future(make_future())
            self.scored += 1
        try:
            return await asyncio.shield(self._scores[key])
        except Exception:
            self._scores.pop(key, None)  # let a later call retry a failed reference
            raise
