"""A pytest plugin: after the run, each worker's modules with the time their tests took (setup, call and teardown
summed, module- and session-scoped fixtures included where a test paid for them), the longest first.

``make test``'s wall time is its busiest worker's sum; the table says where that goes (pytest's own
``--durations`` lists single phases, not modules or workers). Every module's and every test's seconds are also
written to ``build/test_times.json`` (:data:`TIMES_FILE`), to compare two runs or plan the split of the suite.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from repo_paths import REPO
from xdist_scheduling import module_of

TIMES_FILE = REPO / "build" / "test_times.json"

SHOWN = 12  # modules per worker


def longest_first(seconds: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(seconds.items(), key=lambda item: -item[1])


class ModuleTimes:
    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))  # worker -> module -> s
        self.tests: dict[str, float] = defaultdict(float)  # test -> s (setup, call and teardown)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # xdist sets the worker a report came from
        worker = node.gateway.id if node is not None else "main"
        self.seconds[worker][module_of(report.nodeid)] += report.duration
        self.tests[report.nodeid] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.seconds:
            return
        terminalreporter.section("time per worker and module")
        for worker, modules in sorted(self.seconds.items()):
            terminalreporter.write_line(f"{worker}: {sum(modules.values()) / 60:.1f} min in {len(modules)} modules")
            for module, seconds in longest_first(modules)[:SHOWN]:
                terminalreporter.write_line(f"  {seconds / 60:6.1f} min  {module}")
        self.write(TIMES_FILE)
        terminalreporter.write_line(f"every module's and test's seconds: {TIMES_FILE}")

    def write(self, path: Path) -> None:
        """Each worker's modules and every test, in seconds, the longest first."""
        def rounded(seconds: dict[str, float]) -> dict[str, float]:
            return {name: round(s, 2) for name, s in longest_first(seconds)}

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "workers": {worker: {"minutes": round(sum(modules.values()) / 60, 2), "modules": rounded(modules)}
                        for worker, modules in sorted(self.seconds.items())},
            "tests": rounded(self.tests)}, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sees every report
        config.pluginmanager.register(ModuleTimes(), "module_times_table")
