"""A failed test's report carries the log tail of every reward server it used.

A fault that shows on the trainer's side ("connection closed by peer") is often explained only in the server's
own log (why it dropped the transfer); CI keeps nothing but pytest's output, so the tail goes into the report.
"""

from __future__ import annotations

import pytest

from verl_vllm_rm.replicas.launcher import RewardServer

LOG_TAIL_LINES = 60


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:
        servers = {id(v): v for v in getattr(item, "funcargs", {}).values() if isinstance(v, RewardServer)}
        for server in servers.values():
            report.sections.append((f"server log tail ({server.url}, {server.log_path})",
                                    server.log_tail(LOG_TAIL_LINES)))
    return report
