"""The engine watch's decisions over a clock the test moves (the stall itself, on a real server whose engine
process is stopped: tests/integration/server/test_server_lifecycle.py)."""

from __future__ import annotations

import asyncio

import pytest

from verl_vllm_rm.server.engine_watch import EngineWatch

TIMEOUT = 10.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch_of(probe=None, updating=lambda: False) -> tuple[EngineWatch, Clock]:
    clock = Clock()

    async def never_answers():
        await asyncio.Event().wait()

    return EngineWatch(TIMEOUT, probe or never_answers, updating, clock=clock), clock


def test_requests_in_flight_with_no_answer_for_the_timeout_are_a_stall_and_an_answer_ends_it():
    async def go():
        watch, clock = watch_of()
        with watch.request():
            clock.now = TIMEOUT - 0.1
            watch.check()
            assert watch.stalled is None  # not yet: an answer is at most the timeout away
            clock.now = TIMEOUT
            watch.check()
            assert watch.stalled == ("the engine has stalled: engine requests in flight (1) and none answered for "
                                     "10.0 s (--engine-stall-timeout 10 s)")
        assert watch.stalled is None and watch.in_flight == 0  # it came back: the engine answers again

    asyncio.run(go())


def test_an_idle_engine_is_probed_after_half_the_timeout_and_stalls_when_the_probe_gets_no_answer():
    async def go():
        watch, clock = watch_of()
        clock.now = TIMEOUT / 2 - 0.1
        watch.check()
        await asyncio.sleep(0)
        assert watch.in_flight == 0  # not due yet
        clock.now = TIMEOUT / 2
        watch.check()
        await asyncio.sleep(0)
        assert watch.in_flight == 1  # the probe is out
        clock.now = TIMEOUT - 0.1
        watch.check()
        assert watch.stalled is None
        clock.now = TIMEOUT  # the engine's last answer was a whole timeout ago
        watch.check()
        assert watch.stalled == ("the engine has stalled: a one-token probe of the idle engine got no answer within "
                                 "5 s (--engine-stall-timeout 10 s)")

    asyncio.run(go())


def test_an_answered_probe_keeps_an_idle_engine_serving_and_an_engine_error_is_not_a_stall():
    async def go():
        answers = []

        async def probe():
            answers.append(1)
            if len(answers) == 2:
                raise RuntimeError("the engine raised")  # check_health reports an errored engine, not the watch

        watch, clock = watch_of(probe)
        for k in (1, 2):
            clock.now = k * TIMEOUT
            watch.check()
            await asyncio.sleep(0)
            assert len(answers) == k and watch.in_flight == 0 and watch.last_answer == k * TIMEOUT
        clock.now = 3 * TIMEOUT
        watch.check()
        assert watch.stalled is None

    asyncio.run(go())


def test_a_weight_update_holds_the_engine_without_counting_and_without_a_probe():
    async def go():
        updating = [True]
        watch, clock = watch_of(updating=lambda: updating[0])
        with watch.request():
            clock.now = 5 * TIMEOUT
            watch.check()
            await asyncio.sleep(0)
            assert watch.stalled is None and watch.in_flight == 1  # no probe beside the held request
            updating[0] = False
            clock.now = 6 * TIMEOUT - 0.1
            watch.check()
            assert watch.stalled is None  # the clock restarted when the update ended
            clock.now = 6 * TIMEOUT
            watch.check()
            assert watch.stalled is not None

    asyncio.run(go())


def test_a_cancelled_request_is_no_answer():
    async def go():
        watch, clock = watch_of()
        clock.now = 3.0
        with pytest.raises(asyncio.CancelledError):
            with watch.request():
                raise asyncio.CancelledError
        assert watch.last_answer == 0.0 and watch.in_flight == 0

    asyncio.run(go())
