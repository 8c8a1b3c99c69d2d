"""A pytest plugin: the run fails if an aiohttp ``ClientSession`` is left open.

aiohttp reports a session that is garbage-collected open ("Unclosed client session",
"Unclosed connector") from ``__del__``, often at interpreter exit where no test sees
it. This plugin remembers which test created each session in this process and, at
the end of the run, fails it naming the tests whose sessions were collected open or
are still open. Processes the tests start (servers, Ray workers) check their own logs.
"""

from __future__ import annotations

import gc
import weakref

import aiohttp
import pytest

_current_test = ["<collection or session fixture>"]
_alive: dict[int, tuple[weakref.ref, str]] = {}
_collected_open: list[str] = []


def _track_sessions() -> None:
    init, delete = aiohttp.ClientSession.__init__, aiohttp.ClientSession.__del__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _alive[id(self)] = (weakref.ref(self), _current_test[0])

    def __del__(self, *args, **kwargs):
        _, owner = _alive.pop(id(self), (None, "<unknown>"))
        if not self.closed:
            _collected_open.append(owner)
        delete(self, *args, **kwargs)

    aiohttp.ClientSession.__init__ = __init__
    aiohttp.ClientSession.__del__ = __del__


def pytest_configure(config: pytest.Config) -> None:
    _track_sessions()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    _current_test[0] = item.nodeid
    try:
        return (yield)
    finally:
        _current_test[0] = "<between tests>"


def open_sessions() -> list[str]:
    """The creators of the sessions collected open so far or still open now (after a full collection)."""
    gc.collect()
    still_open = [owner for ref, owner in _alive.values() if (s := ref()) is not None and not s.closed]
    return [*_collected_open, *still_open]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leaks = open_sessions()
    if leaks:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = "\n".join(f"  created by {owner}" for owner in sorted(set(leaks)))
        message = f"{len(leaks)} aiohttp ClientSession(s) left open (close every client/manager):\n{lines}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
