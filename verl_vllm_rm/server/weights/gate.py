"""A scorers/updater gate: each ``/score`` request runs entirely before or after an update.

Many ``/score`` requests may run at once; a weight update waits until those in
flight have finished, holds new ones back while it runs, then lets them through.
Waiting updaters take priority over newly arriving scorers, so a steady stream
of scoring cannot starve an update. Single event loop, no threads.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator


class UpdateGate:
    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._scoring = 0
        self._updating = False
        self._waiting_updates = 0

    @property
    def updating(self) -> bool:
        return self._updating

    @asynccontextmanager
    async def scoring(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating and not self._waiting_updates)
            self._scoring += 1
        try:
            yield
        finally:
            async with self._cond:
                self._scoring -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def updating_weights(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting_updates += 1
            try:
                await self._cond.wait_for(lambda: not self._updating and self._scoring == 0)
            finally:
                self._waiting_updates -= 1
            self._updating = True
        try:
            yield
        finally:
            async with self._cond:
                self._updating = False
                self._cond.notify_all()
