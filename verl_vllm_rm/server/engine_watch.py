"""The engine's progress, watched (``--engine-stall-timeout``).

vLLM's ``check_health`` reports an engine that has errored, not one that hangs: a stuck kernel, a deadlock or a
frozen engine process leaves ``/health`` answering 200 while every request waits out the client's read timeout,
and the fleet never restarts the replica. :class:`EngineWatch` counts the engine requests in flight and notes
each one that comes back. The engine has *stalled* when it has work and answers none of it for the timeout:

- requests are in flight and none has come back for ``timeout_s``;
- or, on an idle server (nothing came back for half the timeout and nothing is in flight), a one-token probe is
  sent and does not come back within the other half.

So a stall is seen at most ``timeout_s`` after the engine's last answer (plus the watch's check period, at most a
second). While stalled, ``/health`` answers 503 naming it and ``/score`` answers 503 at once (the client fails
over); the first answer that comes back (a request's or the probe's) ends it, and the server serves again. A weight
update in progress holds the engine on purpose: its time does not count, and no probe is sent. The watch runs on the
API server's event loop, started by the first ``/health`` or ``/score``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from typing import Awaitable, Callable, Iterator

logger = logging.getLogger("verl_vllm_rm.server")

DEFAULT_ENGINE_STALL_TIMEOUT_S = 60.0


class EngineWatch:
    def __init__(self, timeout_s: float, probe: Callable[[], Awaitable[object]], updating: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic):
        """``probe()`` sends the engine one one-token request; ``updating()``: a weight update holds the engine."""
        self.timeout_s = timeout_s
        self._probe, self._updating, self._clock = probe, updating, clock
        self.in_flight = 0
        self.last_answer = clock()
        self.stalled: str | None = None  # why the engine counts as stalled (None: it answers)
        self._probe_sent: float | None = None
        self._task: asyncio.Task | None = None

    @contextmanager
    def request(self) -> Iterator[None]:
        """One engine request: in flight inside, an answer when it ends (with its result or its own error: an
        engine that raises is not hung)."""
        self.in_flight += 1
        try:
            yield
        except asyncio.CancelledError:  # its caller went away: no answer came
            raise
        except Exception:
            self.answered()
            raise
        else:
            self.answered()
        finally:
            self.in_flight -= 1

    def answered(self) -> None:
        self.last_answer = self._clock()
        if self.stalled is not None:
            logger.warning("the engine answers again after a stall (%s): serving", self.stalled)
            self.stalled = None

    def check(self) -> None:
        """Decide, now, whether the engine has stalled, and send the idle probe when it is due."""
        now = self._clock()
        if self._updating():  # the update holds the engine: nothing it does not answer meanwhile counts
            self.last_answer = now
            return
        quiet = now - self.last_answer
        if self._probe_sent is not None and now - self._probe_sent >= self.timeout_s / 2:
            self._stall(f"a one-token probe of the idle engine got no answer within {self.timeout_s / 2:g} s")
        elif self.in_flight and quiet >= self.timeout_s:
            self._stall(f"engine requests in flight ({self.in_flight}) and none answered for {quiet:.1f} s")
        elif self._probe_sent is None and not self.in_flight and quiet >= self.timeout_s / 2:
            self._probe_sent = now
            asyncio.get_running_loop().create_task(self._send_probe())

    def _stall(self, why: str) -> None:
        if self.stalled is None:
            logger.error("the engine has stalled: %s (--engine-stall-timeout %g s); /health and /score answer 503 "
                         "until it answers again", why, self.timeout_s)
        self.stalled = f"the engine has stalled: {why} (--engine-stall-timeout {self.timeout_s:g} s)"

    async def _send_probe(self) -> None:
        try:
            with self.request():
                await self._probe()
        except Exception as e:  # an engine that answers with an error is not hung (check_health reports errors)
            logger.debug("engine probe failed: %s", e)
        finally:
            self._probe_sent = None

    def ensure_running(self) -> None:
        """Start watching on the running loop (once; again if the watch ended)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 8)
        while True:
            await asyncio.sleep(period)
            try:
                self.check()
            except Exception:  # internal: the watch must outlive a bug in one check, and say so
                logger.exception("engine watch check failed")
