"""A pytest plugin: the run fails if a reward server's vLLM engine process outlives its API server.

Servers are started and stopped by many tests (and killed by some on purpose); a server whose
API process dies without its process group would leave its engine core and workers running.
At the end of the run, after every fixture has stopped its servers, this checks that no engine
process is left whose server is gone (``process_helpers.orphaned_engines``).
"""

from __future__ import annotations

import pytest
from process_helpers import wait_for_no_orphaned_engines


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = wait_for_no_orphaned_engines()
    if left:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"FAILED: vLLM engine processes outlived their reward server: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
