"""Rows handed over one at a time, handled together.

verl's reward loop calls ``run_single`` once per row, every row of a batch in one event-loop
iteration (``RewardLoopWorker.compute_score_batch`` starts a task per row and gathers them).
Scoring each row inside its own call interleaves our per-row work with verl's, which costs
about twice the same work done in one loop over the rows (every row's code and data are
cold again). :class:`RowQueue` queues the calls of one iteration and hands them, on the next,
to one coroutine that handles them as a list; each call still gets its own result or error.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from verl_vllm_rm.client.batching import fail_all

Row = tuple[Any, asyncio.Future]  # (the caller's argument, the future its call awaits)


class RowQueue:
    def __init__(self, handle: Callable[[list[Row]], Awaitable[None]]):
        """``handle(rows)`` settles every row's future (a result or an error); an error it raises itself goes
        to each row it left unsettled."""
        self._handle = handle
        self._rows: list[Row] = []
        self._tasks: set[asyncio.Task] = set()

    def put(self, item: Any) -> asyncio.Future:
        """The future of the result ``handle`` gives ``item``, handled with the other items put in this loop
        iteration. A plain function returning the future, not a coroutine: one coroutine fewer per row."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._rows.append((item, future))
        if len(self._rows) == 1:
            loop.call_soon(self._drain)
        return future

    def _drain(self) -> None:
        rows, self._rows = self._rows, []
        task = asyncio.ensure_future(self._run(rows))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, rows: list[Row]) -> None:
        try:
            await self._handle(rows)
        except BaseException as e:  # a failure of the whole set (or its cancellation): every caller left hears it
            fail_all((future for _, future in rows), e)
            if not isinstance(e, Exception):
                raise

    async def close(self) -> None:
        """Cancel the sets being handled (their callers get an error) and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
