"""Pairwise comparison with the prompt's reference answer (validation win rates).

The reference answer of each prompt is scored once per weight version with the same
reward model and the same input format as the responses, cached by prompt and version,
and never counted as a sample. Each response is compared with the reference scored on
its own version (an RM trained during the run publishes new versions while samples are
scored) and gets ``win`` (score > reference), ``win_and`` (score >= reference) and
``ref_margin`` (score - reference).
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Awaitable, Callable, Hashable, Protocol


class MissingReferenceError(KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def win_metrics(score: float, reference: float) -> dict[str, float]:
    return {"win": float(score > reference), "win_and": float(score >= reference), "ref_margin": score - reference}


WIN_KEYS = ("win", "win_and", "ref_margin")


class Versioned(Protocol):
    version: int  # the weight version that computed it


class ReferenceCache:
    """The reference answer of each (prompt group, reference text), once per weight version that scored it.

    The server answers each request on the version it serves when the request arrives, so a caller asks for the
    version its sample was scored on and may get a later one (a publish landed in between): that answer is kept
    under its own version. Concurrent callers share one request in flight per key.
    """

    def __init__(self, max_entries: int = 8192) -> None:
        self._answers: dict[Hashable, dict[int, Versioned]] = {}  # key -> version -> answer
        self._pending: dict[Hashable, asyncio.Future] = {}
        self.max_entries = max_entries
        self.scored = 0

    async def score(self, key: Hashable, make_future: Callable[[], Awaitable[Versioned]],
                    version: int | None = None) -> Versioned:
        """``key``'s answer on ``version`` (None: the newest kept) if kept, else the answer of the request in
        flight for ``key``, else of a new one (``make_future``)."""
        pending = self._pending.get(key)
        if pending is not None and pending.done():  # answered, its done-callback not run yet
            self._settled(key, pending)
        kept = self._answers.get(key, {})
        if version is None and kept:
            return kept[max(kept)]
        if version in kept:
            return kept[version]
        future = self._pending.get(key)
        if future is None:
            future = self._pending[key] = asyncio.ensure_future(make_future())
            future.add_done_callback(partial(self._settled, key))
            self.scored += 1
        return await asyncio.shield(future)

    def _settled(self, key: Hashable, future: asyncio.Future) -> None:
        """Keep a request's answer under its version (once however often it is called); a failed one is not kept
        (a later call asks again)."""
        if self._pending.get(key) is future:
            del self._pending[key]
        if future.cancelled() or future.exception() is not None:
            return
        answer = future.result()
        if key not in self._answers:
            while len(self._answers) >= self.max_entries:  # oldest key first (insertion order)
                self._answers.pop(next(iter(self._answers)))
            self._answers[key] = {}
        self._answers[key][answer.version] = answer
