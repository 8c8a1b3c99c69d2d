"""The captured log records of one logger. A test counts its own logger's records only: the capture also holds
whatever else logs meanwhile, such as asyncio's "exception was never retrieved" for a future of a test that ran
earlier on the same worker, logged whenever the garbage collector frees it."""

from __future__ import annotations

import logging

import pytest


def messages_of(caplog: pytest.LogCaptureFixture, logger: str, level: int = logging.NOTSET) -> list[str]:
    """The messages ``logger`` logged at ``level`` or above, in order."""
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= level]
