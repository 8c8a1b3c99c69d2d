"""A pytest plugin: what the run did with each of the package's user-facing raises, and the gate of ``make test``
on it.

Two records meet here:

- ``pytest.raises``, watched in the tests' own processes: when one catches its exception, each exception of the
  chain (``raise ... from`` included) is traced to the line that raised it; a line of ``verl_vllm_rm/`` is
  recorded with the test, and as matched when the ``match`` pattern finds that exception's message;
- the raise probe (``tests/support/raise_probe.py``, on under ``make test``): every raise that ran, in any process
  (the reward servers, ``main_ppo`` and its Ray workers included), whose tests read the message from an HTTP
  answer, a log or an exit message. Such a raise counts as asserted when a test's string quotes its message.

After the run (the xdist workers send theirs to the controller) the summary counts the user-facing raises
(``verl_vllm_rm/dev/reference_docs/raises.py``: a literal message, not marked ``# internal:``) by status, and
``build/raise_record.json`` lists each. A run of every test module with the probe on fails when a raise never ran
or ran with no test quoting its message, unless :data:`NOT_YET_EXECUTED` lists it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from collections import defaultdict
from pathlib import Path
from types import TracebackType

import pytest
from _pytest.raises import RaisesExc

from raise_probe import DIR_ENV, seen_lines
from repo_paths import PACKAGE, REPO, SUPPORT, TESTS
from verl_vllm_rm.dev.reference_docs.raises import LiteralRaise, package_raises, words

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


WINDOW = 4  # consecutive words of a message's literal piece that a test must quote
MIN_CHARS = 16  # ... spanning at least this many characters (shorter runs are phrases many messages share)


def quoting_sources() -> list[Path]:
    """The test files whose strings can quote a message (tests/support's helpers quote none)."""
    return [f for f in TESTS.rglob("*.py") if f.parent != SUPPORT]


def strings_of_tests(files: list[Path]) -> str:
    """The string and bytes literals of ``files`` (f-strings' literal parts included; docstrings and comments not: they
    describe, they do not check), as plain words with regex escapes dropped (``match=r"a \\(b\\)"`` reads
    ``a (b)``)."""
    chunks = []
    for file in files:
        tree = ast.parse(file.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
        chunks += [node.value if isinstance(node.value, str) else node.value.decode(errors="replace")
                   for node in ast.walk(tree) if isinstance(node, ast.Constant)
                   and isinstance(node.value, (str, bytes)) and id(node) not in docstrings]
    return words(re.sub(r"\\(.)", r"\1", "\n".join(chunks)))


def asserted(raise_: LiteralRaise, strings: str) -> bool:
    """Whether a test's string quotes ``WINDOW`` consecutive words (``MIN_CHARS`` or more) of one of the message's
    literal pieces: the test that expects the message."""
    for piece in raise_.pieces:
        tokens = piece.split(" ")
        size = min(WINDOW, len(tokens))
        for start in range(len(tokens) - size + 1):
            run = " ".join(tokens[start:start + size])
            if len(run) >= min(MIN_CHARS, len(piece)) and run in strings:
                return True
    return False


STATUSES = ("matched", "asserted", "not asserted", "not executed")


def summarise(record: RaiseRecord, executed: set[tuple[str, int]], strings: str,
              package: Path = PACKAGE) -> tuple[dict[str, int], list[dict]]:
    """Each user-facing raise of ``package`` with what the run did with it:

    - ``matched``: a test's pytest.raises caught it and its ``match`` found the message;
    - ``asserted``: it ran (``executed``: lines any process recorded, :mod:`raise_probe`) and a test's string
      quotes its message (the test reads it from an HTTP answer, a log, an exit message);
    - ``not asserted``: it ran and no test quotes its message; ``not executed``: it never ran."""
    rows = []
    for raise_ in package_raises(package):
        if raise_.internal:
            continue
        tests = {test: matched for (path, line), by_test in record.tests.items()
                 if path == raise_.path and raise_.covers(line) for test, matched in by_test.items()}
        ran = bool(tests) or any(path == raise_.path and raise_.covers(line) for path, line in executed)
        status = ("matched" if any(tests.values()) else "not executed" if not ran
                  else "asserted" if asserted(raise_, strings) else "not asserted")
        rows.append({"raise": f"{raise_.path}:{raise_.line}", "message": raise_.template, "status": status,
                     "tests": sorted(test for test, matched in tests.items() if matched)})
    counts = {status: sum(row["status"] == status for row in rows) for status in STATUSES}
    return counts, rows


def complete_run(config: pytest.Config, modules_run: set[str], tests: Path = TESTS) -> bool:
    """Whether the run ran every test module under ``tests`` with no ``-k``/``-m`` selection: only such a run
    can say a raise is never executed."""
    on_disk = {str(f.relative_to(tests.parent)) for f in tests.rglob("test_*.py")}
    return not config.option.keyword and not config.option.markexpr and on_disk <= modules_run


#: user-facing raises that no test runs yet, each ``"path: the message's first words"`` (the message's text, not
#: its line: lines move): the gate tolerates these and fails when one of them runs and is asserted (take it off)
NOT_YET_EXECUTED: frozenset[str] = frozenset()


def gate_failures(rows: list[dict], not_yet: frozenset[str] = NOT_YET_EXECUTED) -> list[str]:
    """What fails a complete run: a raise not executed or not asserted that :data:`NOT_YET_EXECUTED` does not list,
    and a listed one that is now asserted."""
    failures, listed_seen = [], set()
    for row in rows:
        key = next((entry for entry in not_yet if entry == row_key(row, len(entry))), None)
        if key is not None:
            listed_seen.add(key)
        failing = row["status"] in ("not asserted", "not executed")
        if failing and key is None:
            failures.append(f"{row['raise']}: {row['status']}: {row['message'][:120]}")
        elif not failing and key is not None:
            failures.append(f"{row['raise']}: now {row['status']}: take {key!r} off NOT_YET_EXECUTED")
    failures += [f"NOT_YET_EXECUTED lists {key!r}, which is no raise of the package: take it off"
                 for key in sorted(not_yet - listed_seen)]
    return failures


def row_key(row: dict, length: int) -> str:
    """A row as :data:`NOT_YET_EXECUTED` names it, cut to ``length`` characters."""
    return f"{row['raise'].rsplit(':', 1)[0]}: {row['message']}"[:length]


class Controller:
    """The run's summary and gate (the controller, or a run without xdist)."""

    def __init__(self, record: RaiseRecord) -> None:
        self.record = record
        self.modules_run: set[str] = set()
        self.result: tuple[dict[str, int], list[dict]] | None = None
        self.failures: list[str] = []
        self.gated = False  # whether this run can say a raise never runs (the whole suite, the probe on)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.record.add_rows(json.loads(getattr(node, "workeroutput", {}).get(WORKER_KEY, "[]")))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.modules_run.add(report.nodeid.split("::", 1)[0])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        probe_dir = os.environ.get(DIR_ENV)
        if not self.record.tests and not probe_dir:
            return
        executed = seen_lines(probe_dir) if probe_dir else set()
        strings = strings_of_tests(quoting_sources())
        self.result = summarise(self.record, executed, strings)
        counts, rows = self.result
        self.gated = bool(probe_dir) and complete_run(session.config, self.modules_run)
        if self.gated:
            self.failures = gate_failures(rows)
            if self.failures and session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        RECORD_FILE.parent.mkdir(exist_ok=True)
        RECORD_FILE.write_text(json.dumps({"counts": counts, "probe": bool(probe_dir), "raises": rows},
                                          indent=1) + "\n")

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.result is None:
            return
        counts, rows = self.result
        terminalreporter.section("the package's user-facing raises in this run")
        where = ("every process (tests/support/raise_probe.py)" if os.environ.get(DIR_ENV)
                 else "the tests' own processes only (make test records the servers' and main_ppo's too)")
        terminalreporter.write_line(
            f"{len(rows)} raises, seen in {where}: {counts['matched']} caught by a pytest.raises matching their "
            f"message, {counts['asserted']} executed with their message quoted by a test, "
            f"{counts['not asserted']} executed with no test quoting their message, {counts['not executed']} not "
            f"executed: {RECORD_FILE.relative_to(REPO)}")
        if not self.gated:
            terminalreporter.write_line("not checked here that every raise runs: only make test over the whole suite "
                                        "(every module, no -k or -m) checks it")
        if self.failures:
            terminalreporter.write_line(
                f"FAILED: {len(self.failures)} raise(s): add a test that triggers each and checks its message, or "
                "mark it '# internal: <why no user can hit it>' on its line or the line above:", red=True)
            for failure in self.failures:
                terminalreporter.write_line(f"  {failure}", red=True)


RECORD = pytest.StashKey[RaiseRecord]()


def pytest_configure(config: pytest.Config) -> None:
    record = RaiseRecord()
    if (probe_dir := os.environ.get(DIR_ENV)) and not hasattr(config, "workerinput"):
        shutil.rmtree(os.path.join(probe_dir, "seen"), ignore_errors=True)  # this run's lines only
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
