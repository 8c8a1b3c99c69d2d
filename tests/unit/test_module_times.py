"""The per-module time table's file (``tests/support/module_times.py``): every module's and every test's seconds,
summed over setup, call and teardown, per worker, the longest first."""

from __future__ import annotations

import json

import pytest
from module_times import ModuleTimes


def report(nodeid: str, when: str, seconds: float) -> pytest.TestReport:
    return pytest.TestReport(nodeid=nodeid, location=(nodeid.split("::")[0], 0, nodeid), keywords={},
                             outcome="passed", longrepr=None, when=when, duration=seconds)


def test_the_times_file_sums_each_tests_phases_per_module_longest_first(tmp_path):
    times = ModuleTimes()
    for nodeid, when, seconds in [("tests/a.py::fast", "call", 1.0), ("tests/b.py::slow", "setup", 30.0),
                                  ("tests/b.py::slow", "call", 6.0), ("tests/a.py::other", "call", 2.5),
                                  ("tests/b.py::slow", "teardown", 0.5)]:
        times.pytest_runtest_logreport(report(nodeid, when, seconds))
    path = tmp_path / "build" / "test_times.json"
    times.write(path)
    written = json.loads(path.read_text())
    assert written["tests"] == {"tests/b.py::slow": 36.5, "tests/a.py::other": 2.5, "tests/a.py::fast": 1.0}
    assert list(written["tests"]) == ["tests/b.py::slow", "tests/a.py::other", "tests/a.py::fast"]
    assert written["workers"] == {"main": {"minutes": 0.67, "modules": {"tests/b.py": 36.5, "tests/a.py": 3.5}}}
