"""``RowQueue``: verl's per-row calls of one loop iteration handled as one list, each caller its own answer."""

import asyncio

import pytest

from verl_vllm_rm.client.batching import fail
from verl_vllm_rm.scoring.row_queue import RowQueue


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


async def call(queue: RowQueue, item):
    """One caller, as verl's reward loop makes one: a task awaiting its row's result (``run_single``)."""
    return await queue.put(item)


def test_calls_of_one_iteration_are_handled_together_and_each_gets_its_result():
    handled: list[list[int]] = []

    async def handle(rows):
        handled.append([item for item, _ in rows])
        for item, future in rows:
            future.set_result(item * 10)

    async def main():
        queue = RowQueue(handle)
        first = await asyncio.gather(*(queue.put(i) for i in range(5)))
        second = await asyncio.gather(queue.put(7), queue.put(8))
        return first, second

    assert run(main()) == ([0, 10, 20, 30, 40], [70, 80])
    assert handled == [[0, 1, 2, 3, 4], [7, 8]]


def test_an_error_of_one_row_reaches_only_its_caller():
    async def handle(rows):
        for item, future in rows:
            if item == 2:
                fail(future, ValueError(f"row {item} is bad"))
            else:
                future.set_result(item)

    async def main():
        queue = RowQueue(handle)
        return await asyncio.gather(*(queue.put(i) for i in range(4)), return_exceptions=True)

    out = run(main())
    assert out[:2] == [0, 1] and out[3] == 3
    assert isinstance(out[2], ValueError) and "row 2 is bad" in str(out[2])


def test_a_failure_of_the_whole_set_reaches_every_caller_it_left_unanswered():
    async def handle(rows):
        rows[0][1].set_result("answered")
        raise ConnectionError("server gone")

    async def main():
        queue = RowQueue(handle)
        return await asyncio.gather(*(queue.put(i) for i in range(3)), return_exceptions=True)

    out = run(main())
    assert out[0] == "answered"
    assert all(isinstance(e, ConnectionError) and "server gone" in str(e) for e in out[1:])


def test_a_cancelled_caller_leaves_the_others_answered():
    release = None

    async def handle(rows):
        await release.wait()
        for item, future in rows:
            if not future.done():
                future.set_result(item)

    async def main():
        nonlocal release
        release = asyncio.Event()
        queue = RowQueue(handle)
        tasks = [asyncio.ensure_future(call(queue, i)) for i in range(3)]
        await asyncio.sleep(0.01)
        tasks[1].cancel()
        release.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    out = run(main())
    assert out[0] == 0 and out[2] == 2 and isinstance(out[1], asyncio.CancelledError)


def test_close_stops_a_set_being_handled_and_its_callers_hear_it():
    async def handle(rows):
        await asyncio.sleep(3600)

    async def main():
        queue = RowQueue(handle)
        calls = [asyncio.ensure_future(call(queue, i)) for i in range(2)]
        await asyncio.sleep(0.01)
        await queue.close()
        out = await asyncio.gather(*calls, return_exceptions=True)
        return out, [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    out, left = run(main())
    assert left == []
    assert all(isinstance(e, RuntimeError) and "scoring interrupted" in str(e) for e in out)


def test_an_interrupt_reaches_the_callers_and_is_not_swallowed():
    runs: list[asyncio.Task] = []

    async def handle(rows):
        runs.append(asyncio.current_task())
        raise KeyboardInterrupt

    loop = asyncio.new_event_loop()
    queue = RowQueue(handle)
    calls = [loop.create_task(call(queue, i)) for i in range(2)]
    gathered = asyncio.gather(*calls)
    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(gathered)
    loop.run_until_complete(asyncio.gather(*calls, return_exceptions=True))
    assert all("scoring interrupted: KeyboardInterrupt" in str(c.exception()) for c in calls)
    # Every future's error read here: none is logged as "never retrieved" when collected, in a later test.
    assert isinstance(runs[0].exception(), KeyboardInterrupt)
    assert "scoring interrupted" in str(gathered.exception())
    loop.close()
