"""A pytest plugin: after the run, each worker's modules with the time their tests took (setup, call and teardown
summed, module- and session-scoped fixtures included where a test paid for them), the longest first.

``make test``'s wall time is its busiest worker's sum; the table says where that goes (pytest's own
``--durations`` lists single phases, not modules or workers).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from xdist_scheduling import module_of

SHOWN = 12  # modules per worker


class ModuleTimes:
    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # worker -> module -> s

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # xdist sets the worker a report came from
        worker = node.gateway.id if node is not None else "main"
        self.seconds[worker][module_of(report.nodeid)] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        terminalreporter.section("time per worker and module")
        for worker, modules in sorted(self.seconds.items()):
            ranked = sorted(modules.items(), key=lambda item: -item[1])
            terminalreporter.write_line(f"{worker}: {sum(modules.values()) / 60:.1f} min in {len(modules)} modules")
            for module, seconds in ranked[:SHOWN]:
                terminalreporter.write_line(f"  {seconds / 60:6.1f} min  {module}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sees every report
        config.pluginmanager.register(ModuleTimes(), "module_times_table")
