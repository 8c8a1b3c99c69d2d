"""A pytest plugin: which of the package's raises the tests triggered in their own processes, and which of those a
``pytest.raises(..., match=...)`` caught with its message matched.

It watches ``pytest.raises``: when one catches its exception, each exception of the chain (``raise ... from``
included) is traced to the line that raised it; a line of ``verl_vllm_rm/`` is recorded with the test, and as
matched when the ``match`` pattern finds that exception's message. After the run (the xdist workers send theirs to
the controller) the summary counts the package's user-facing raises (``verl_vllm_rm/dev/reference_docs/raises.py``:
a literal message, not marked ``# internal:``) by what was seen of them, and ``build/raise_record.json`` lists each.

A raise in a subprocess (the reward server, ``main_ppo`` and its Ray workers) is not seen here: its test reads the
message from an HTTP answer or a log. Those count as "not seen in the tests' processes".
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from types import TracebackType

import pytest
from _pytest.raises import RaisesExc

from repo_paths import PACKAGE, REPO

RECORD_FILE = REPO / "build" / "raise_record.json"
WORKER_KEY = "raise_record"


class RaiseRecord:
    def __init__(self) -> None:
        self.tests: dict[tuple[str, int], dict[str, bool]] = defaultdict(dict)  # (path, line) -> test -> matched
        self.current_test = ""

    def add(self, exception: BaseException, pattern: re.Pattern[str] | str | None) -> None:
        """``exception`` caught by a pytest.raises with ``pattern``; each exception it was raised from is matched
        too when the pattern finds its own message, or found the caught one's and that contains its message (an
        option error re-raised with its path in front)."""
        caught = str(exception)
        caught_matched = pattern is not None and re.search(pattern, caught) is not None
        seen: set[int] = set()
        while exception is not None and id(exception) not in seen:
            seen.add(id(exception))
            site = raise_site(exception.__traceback__)
            if site is not None:
                message = str(exception)
                in_caught = caught_matched and bool(message) and message in caught
                self._note(site, self.current_test,
                           pattern is not None and (re.search(pattern, message) is not None or in_caught))
            exception = exception.__cause__ or exception.__context__

    def _note(self, site: tuple[str, int], test: str, matched: bool) -> None:
        """A test saw the raise at ``site``: matched once by any of its catches is matched."""
        tests = self.tests[site]
        tests[test] = tests.get(test, False) or matched

    def as_rows(self) -> list[list]:
        return [[path, line, test, matched] for (path, line), tests in self.tests.items()
                for test, matched in tests.items()]

    def add_rows(self, rows: list[list]) -> None:
        for path, line, test, matched in rows:
            self._note((path, line), test, matched)


def raise_site(traceback: TracebackType | None) -> tuple[str, int] | None:
    """The package line an exception was raised at (its traceback's last frame), or None when it was raised
    elsewhere (a library, a test)."""
    if traceback is None:
        return None
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    path = traceback.tb_frame.f_code.co_filename
    if not path.startswith(f"{PACKAGE}/"):
        return None
    return path[len(str(REPO)) + 1:], traceback.tb_lineno


def summarise(record: RaiseRecord) -> tuple[dict[str, int], list[dict]]:
    """Each user-facing raise of the package with what was seen of it: ``matched`` (a test's pytest.raises caught
    it and matched its message), ``caught`` (caught, its message not matched there), or ``not seen``."""
    from verl_vllm_rm.dev.reference_docs.raises import package_raises

    rows = []
    for raise_ in package_raises(PACKAGE):
        if raise_.internal:
            continue
        tests = {test: matched for (path, line), by_test in record.tests.items()
                 if path == raise_.path and raise_.covers(line) for test, matched in by_test.items()}
        status = "matched" if any(tests.values()) else "caught" if tests else "not seen"
        rows.append({"raise": f"{raise_.path}:{raise_.line}", "message": raise_.template, "status": status,
                     "tests": sorted(test for test, matched in tests.items() if matched or status == "caught")})
    counts = {status: sum(row["status"] == status for row in rows) for status in ("matched", "caught", "not seen")}
    return counts, rows


class Controller:
    """The run's summary (the controller, or a run without xdist)."""

    def __init__(self, record: RaiseRecord) -> None:
        self.record = record

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.record.add_rows(json.loads(getattr(node, "workeroutput", {}).get(WORKER_KEY, "[]")))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.record.tests:
            return
        counts, rows = summarise(self.record)
        RECORD_FILE.parent.mkdir(exist_ok=True)
        RECORD_FILE.write_text(json.dumps({"counts": counts, "raises": rows}, indent=1) + "\n")
        terminalreporter.section("the package's user-facing raises, as the tests' own processes saw them")
        terminalreporter.write_line(
            f"{counts['matched']} of {len(rows)} raised and caught by a pytest.raises matching their message, "
            f"{counts['caught']} caught without a match, {counts['not seen']} not seen (raised in a server or "
            f"main_ppo process, or not executed): {RECORD_FILE.relative_to(REPO)}")


RECORD = pytest.StashKey[RaiseRecord]()


def pytest_configure(config: pytest.Config) -> None:
    record = RaiseRecord()
    original_exit = RaisesExc.__exit__

    def recording_exit(self, exc_type, exc_val, exc_tb) -> bool:
        __tracebackhide__ = True
        caught = original_exit(self, exc_type, exc_val, exc_tb)
        if caught and exc_val is not None:
            record.add(exc_val, self.match)
        return caught

    RaisesExc.__exit__ = recording_exit
    config.add_cleanup(lambda: setattr(RaisesExc, "__exit__", original_exit))
    config.stash[RECORD] = record
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Controller(record), "raise_record_summary")



@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    item.config.stash[RECORD].current_test = item.nodeid  # its fixtures' pytest.raises too
    return (yield)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput[WORKER_KEY] = json.dumps(session.config.stash[RECORD].as_rows())
