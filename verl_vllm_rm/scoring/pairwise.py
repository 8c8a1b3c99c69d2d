"""Pairwise comparison with the prompt's reference answer (validation win rates).

The reference answer of each prompt is scored once with the same reward model and
the same input format as the responses, cached by prompt, and never counted as a
sample. Each response then gets ``win`` (score > reference), ``win_and``
(score >= reference) and ``ref_margin`` (score - reference).
"""

from __future__ import annotations

from typing import Any, Hashable

REFERENCE_SOURCES = ("ground_truth", "rm_gallery")  # or "extra_info:<key>"


class MissingReferenceError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def validate_reference_source(source: str) -> str:
    if source in REFERENCE_SOURCES or (source.startswith("extra_info:") and len(source) > len("extra_info:")):
        return source
    raise ValueError(
        f"reference_source={source!r} is not one of {list(REFERENCE_SOURCES)} or 'extra_info:<key>'"
    )


def reference_text(fields: dict[str, Any], source: str) -> str | None:
    """The reference answer in one sample's non-tensor fields (None when it has none)."""
    nt = fields
    if source == "ground_truth":
        value = (nt.get("reward_model") or {}).get("ground_truth")
    elif source == "rm_gallery":  # rm-gallery's DataSample shape: extra_info["y"][0]["content"]
        ys = (nt.get("extra_info") or {}).get("y") or []
        value = ys[0].get("content") if ys and isinstance(ys[0], dict) else None
    else:
        value = (nt.get("extra_info") or {}).get(source.split(":", 1)[1])
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value)


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
