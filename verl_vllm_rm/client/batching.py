"""Coalesce per-sample score calls into grouped, budget-bounded requests.

verl's reward loop calls ``run_single`` once per trajectory, concurrently. The
batcher collects the calls that arrive within ``coalesce_s``, orders them so the
members of one prompt group (same ``uid``) are adjacent, and sends them in as few
requests as the batch budget allows: the server then computes each shared prompt
once (prefix cache) and amortises HTTP overhead over the whole group. The budget
is applied here, once: each chunk goes to ``score_fn`` as one request
(``VLLMRewardClient.score_request``, which does not split again).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Hashable, Iterable, Sequence, TypeVar

T = TypeVar("T")
ScoreFn = Callable[[list], Awaitable[list[float]]]


def split_by_budget(sizes: Sequence[int], max_seqs: int, max_tokens: int) -> list[range]:
    """Consecutive index ranges with at most ``max_seqs`` items and ``max_tokens`` summed size.

    An item larger than ``max_tokens`` on its own still gets a range of its own.
    """
    ranges, start, tokens = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_seqs or tokens + size > max_tokens):
            ranges.append(range(start, i))
            start, tokens = i, 0
        tokens += size
    if start < len(sizes):
        ranges.append(range(start, len(sizes)))
    return ranges


def group_order(keys: Sequence[Hashable]) -> list[int]:
    """Indices ordering items group by group, groups in order of first arrival (stable)."""
    first_seen: dict[Hashable, int] = {}
    for i, k in enumerate(keys):
        first_seen.setdefault(k, i)
    return sorted(range(len(keys)), key=lambda i: (first_seen[keys[i]], i))


def fail(future: asyncio.Future, error: BaseException) -> None:
    """Give one caller its error (unless it is gone: a cancelled caller's future is done)."""
    if not future.done():
        future.set_exception(error)


def fail_all(futures: Iterable[asyncio.Future], e: BaseException) -> None:
    """Give every caller still waiting the error that ended their set: ``e``, or for an interrupt (cancellation,
    KeyboardInterrupt, which the one interrupted re-raises) a RuntimeError that names it."""
    error = e if isinstance(e, Exception) else RuntimeError(f"scoring interrupted: {e!r}")
    for future in futures:
        fail(future, error)


@dataclass(slots=True)
class _Pending:
    key: Hashable
    item: Sequence[int] | str  # token ids (a list or a 1-D integer array) or a text
    future: asyncio.Future


class GroupBatcher:
    """Micro-batches ``submit`` calls made on one event loop.

    ``score_fn`` sends a list of items (token-id lists or texts) that fits the
    budget as one request and returns one score per item, in order. A failing
    request fails only the samples it carried.
    """

    def __init__(self, score_fn: ScoreFn, *, coalesce_s: float, max_seqs: int, max_tokens: int):
        self._score_fn = score_fn
        self._coalesce_s = coalesce_s
        self._max_seqs = max_seqs
        self._max_tokens = max_tokens
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Task] = set()
        self.requests_sent = 0

    def submit(self, key: Hashable, item: Sequence[int] | str) -> asyncio.Future:
        """Queue ``item``; the returned future (await it) gets its score. Call it on the running loop.

        A plain function returning a future, not a coroutine: the caller needs no task per sample.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append(_Pending(key, item, future))
        if len(self._pending) >= self._max_seqs:
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._coalesce_s, self.flush)
        return future

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._in_flight)

    async def cancel_in_flight(self) -> None:
        """Cancel every queued and in-flight request (their callers get an error) and wait for them."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for p in pending:
            if not p.future.done():
                p.future.set_exception(RuntimeError("scoring cancelled: the batch it belonged to failed"))
        tasks = list(self._in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def flush(self) -> None:
        """Send what is queued now (the coalescing timer does it otherwise)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if not batch:
            return
        ordered = [batch[i] for i in group_order([p.key for p in batch])]
        for r in split_by_budget([len(p.item) for p in ordered], self._max_seqs, self._max_tokens):
            task = asyncio.ensure_future(self._send([ordered[i] for i in r]))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _send(self, chunk: list[_Pending]) -> None:
        self.requests_sent += 1
        try:
            scores = await self._score_fn([p.item for p in chunk])
        except BaseException as e:  # delivered to every caller of this chunk, never swallowed
            fail_all((p.future for p in chunk), e)
            if not isinstance(e, Exception):
                raise
            return
        for p, s in zip(chunk, scores):
            if not p.future.done():
                p.future.set_result(s)
