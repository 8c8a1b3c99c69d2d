"""The scorers/updater gate (``server.weights.gate``) on one event loop: an update waits for the scoring in flight,
holds new scoring back while it runs and while it waits, and leaves the gate open however it ends. The tasks step
only when the test yields to the loop (``asyncio.sleep(0)``: one pass of the ready tasks, no waiting on a clock)."""

from __future__ import annotations

import asyncio

import pytest

from verl_vllm_rm.server.weights.gate import UpdateGate


async def step() -> None:
    """Let every ready task run until it blocks (a few passes of the loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Trace:
    """A gate and what went through it, in order."""

    def __init__(self) -> None:
        self.gate, self.log = UpdateGate(), []

    async def score(self, name: str, until: asyncio.Event | None = None) -> None:
        async with self.gate.scoring():
            self.log.append(f"{name} in")
            if until is not None:
                await until.wait()
            self.log.append(f"{name} out")

    async def update(self, name: str, until: asyncio.Event | None = None, fail: bool = False) -> None:
        async with self.gate.updating_weights():
            self.log.append(f"{name} in (updating={self.gate.updating})")
            if until is not None:
                await until.wait()
            if fail:
                raise RuntimeError("reload failed")
            self.log.append(f"{name} out")


async def update_behind_scoring(trace: Trace) -> tuple[asyncio.Task, asyncio.Task, asyncio.Event]:
    """Scoring ``s1`` in flight (until the event is set), then an update ``u`` asked for: it waits."""
    done_scoring = asyncio.Event()
    first = asyncio.create_task(trace.score("s1", done_scoring))
    await step()
    update = asyncio.create_task(trace.update("u"))
    await step()
    return first, update, done_scoring


def test_an_update_waits_for_the_scoring_in_flight_and_holds_back_the_scoring_that_comes_after():
    async def run() -> list[str]:
        trace = Trace()
        first, update, done_scoring = await update_behind_scoring(trace)
        later = asyncio.create_task(trace.score("s2"))  # arrives while the update waits: held back
        await step()
        assert trace.log == ["s1 in"] and not trace.gate.updating
        done_scoring.set()
        await asyncio.gather(first, update, later)
        assert not trace.gate.updating
        return trace.log

    assert asyncio.run(run()) == ["s1 in", "s1 out", "u in (updating=True)", "u out", "s2 in", "s2 out"]


def test_scoring_runs_side_by_side_when_no_update_is_asked_for():
    async def run() -> list[str]:
        trace, release = Trace(), asyncio.Event()
        tasks = [asyncio.create_task(trace.score(name, release)) for name in ("a", "b", "c")]
        await step()
        assert trace.log == ["a in", "b in", "c in"]
        release.set()
        await asyncio.gather(*tasks)
        return trace.log

    assert asyncio.run(run())[3:] == ["a out", "b out", "c out"]


def test_two_updates_run_one_after_the_other():
    async def run() -> list[str]:
        trace, release = Trace(), asyncio.Event()
        first = asyncio.create_task(trace.update("u1", release))
        second = asyncio.create_task(trace.update("u2"))
        await step()
        assert trace.log == ["u1 in (updating=True)"]
        release.set()
        await asyncio.gather(first, second)
        return trace.log

    assert asyncio.run(run()) == ["u1 in (updating=True)", "u1 out", "u2 in (updating=True)", "u2 out"]


def test_a_failed_update_opens_the_gate_again():
    async def run() -> list[str]:
        trace = Trace()
        with pytest.raises(RuntimeError, match="reload failed"):
            await trace.update("u", fail=True)
        assert not trace.gate.updating
        await trace.score("s")
        return trace.log

    assert asyncio.run(run()) == ["u in (updating=True)", "s in", "s out"]


def test_an_update_cancelled_while_it_waits_holds_nothing_back():
    async def run() -> list[str]:
        trace = Trace()
        first, update, done_scoring = await update_behind_scoring(trace)
        update.cancel()  # e.g. its client went away while it waited for s1
        await step()
        await trace.score("s2")  # enters beside s1: no update waits any more
        done_scoring.set()
        await first
        assert update.cancelled() and not trace.gate.updating
        return trace.log

    assert asyncio.run(run()) == ["s1 in", "s2 in", "s2 out", "s1 out"]
