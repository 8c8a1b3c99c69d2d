"""The raise record (``tests/support/raise_record.py``): a package raise caught by ``pytest.raises`` is traced to
its line, through a chain too, and counted as matched only when the pattern finds its message."""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace

import pytest
from package_sources import package_with
from raise_probe import DIR_ENV
from raise_record import Controller, RaiseRecord, complete_run, gate_failures, raise_site, summarise
from repo_paths import TESTS

from verl_vllm_rm.rows import validate_reference_source


def raise_line() -> int:
    """The line of ``validate_reference_source``'s raise (a statement over several lines: its first)."""
    lines, first = inspect.getsourcelines(validate_reference_source)
    return first + next(i for i, line in enumerate(lines) if line.strip().startswith("raise "))


def caught(pattern: str | None) -> BaseException:
    with pytest.raises(ValueError, match=pattern) as err:
        validate_reference_source("nowhere")
    return err.value


def test_a_package_raise_is_traced_to_its_line_and_a_test_raise_is_not():
    assert raise_site(caught(None).__traceback__) == ("verl_vllm_rm/rows.py", raise_line())
    try:
        raise KeyError("a test's own")
    except KeyError as e:
        assert raise_site(e.__traceback__) is None


def test_matched_only_when_the_pattern_finds_the_message_and_a_chain_is_followed():
    record = RaiseRecord()
    record.current_test = "t1"
    record.add(caught(None), None)  # caught, no pattern
    record.add(caught("is not one of"), r"is not one of \['ground_truth'")
    site = ("verl_vllm_rm/rows.py", raise_line())
    assert record.tests[site] == {"t1": True}
    record.current_test = "t2"
    record.add(caught(None), "a pattern this message does not have")
    assert record.tests[site] == {"t1": True, "t2": False}
    try:  # the package's raise behind a test's: found through __cause__
        try:
            validate_reference_source("nowhere")
        except ValueError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as wrapped:
        chained = RaiseRecord()
        chained.current_test = "t3"
        chained.add(wrapped, "reference_source='nowhere'")
    assert chained.tests == {site: {"t3": True}}
    try:  # re-raised with a prefix: the caught message, matched, contains the package's own
        try:
            validate_reference_source("nowhere")
        except ValueError as e:
            raise RuntimeError(f"reward_kwargs: {e}") from e
    except RuntimeError as prefixed:
        for pattern, matched in (("^reward_kwargs: reference_source='nowhere'", True), ("^reward_kwargs: x", False)):
            inner = RaiseRecord()
            inner.current_test = "t4"
            inner.add(prefixed, pattern)
            assert inner.tests == {site: {"t4": matched}}


def test_the_summary_counts_each_user_facing_raise_once_by_what_was_seen_of_it():
    record = RaiseRecord()
    record.current_test = "t1"
    record.add(caught(None), "reference_source='nowhere'")
    record.add_rows(RaiseRecord().as_rows() + record.as_rows())  # a worker's rows merged again: no double count
    counts, rows = summarise(record, set(), "")
    row = next(r for r in rows if r["raise"] == f"verl_vllm_rm/rows.py:{raise_line()}")
    assert row["status"] == "matched" and row["tests"] == ["t1"]
    assert sum(counts.values()) == len(rows) and counts["matched"] == 1
    assert all(r["status"] == "not executed" and r["tests"] == [] for r in rows if r is not row)


def package_with_three_raises(tmp_path):
    return package_with(
        tmp_path,
        "def f(x):\n"
        "    if x == 1:\n"
        "        raise ValueError('the first message a server answers with')\n"
        "    if x == 2:\n"
        "        raise ValueError(\n"
        "            f'the second message {x} spans two lines of the source')\n"
        "    raise KeyError('the third message that nothing ever runs')\n")


def test_a_raise_another_process_ran_is_asserted_only_when_a_tests_string_quotes_it(tmp_path):
    package = package_with_three_raises(tmp_path)
    executed = {("pkg/mod.py", 3), ("pkg/mod.py", 5)}
    strings = "assert 'the first message a server' in answer"
    counts, rows = summarise(RaiseRecord(), executed, strings, package)
    assert [(r["raise"], r["status"]) for r in rows] == [
        ("pkg/mod.py:3", "asserted"), ("pkg/mod.py:5", "not asserted"), ("pkg/mod.py:7", "not executed")]
    assert counts == {"matched": 0, "asserted": 1, "not asserted": 1, "not executed": 1}


def test_the_gate_fails_on_each_raise_not_run_or_not_quoted_unless_listed_and_on_a_stale_listing(tmp_path):
    _, rows = summarise(RaiseRecord(), {("pkg/mod.py", 3), ("pkg/mod.py", 5)}, "the first message a server",
                        package_with_three_raises(tmp_path))
    assert gate_failures(rows, frozenset()) == [
        "pkg/mod.py:5: not asserted: the second message {x} spans two lines of the source",
        "pkg/mod.py:7: not executed: the third message that nothing ever runs"]
    listed = frozenset({"pkg/mod.py: the third message", "pkg/mod.py: the second message"})
    assert gate_failures(rows, listed) == []
    assert gate_failures(rows, listed | {"pkg/mod.py: the first message"}) == [
        "pkg/mod.py:3: now asserted: take 'pkg/mod.py: the first message' off NOT_YET_EXECUTED"]
    assert gate_failures(rows, listed | {"pkg/gone.py: a raise since deleted"}) == [
        "NOT_YET_EXECUTED lists 'pkg/gone.py: a raise since deleted', which is no raise of the package: take it off"]


def test_only_a_run_of_every_module_without_a_selection_is_complete(tmp_path):
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    for name in ("unit/test_a.py", "test_b.py"):
        (tests / name).write_text("")
    everything = {"tests/unit/test_a.py", "tests/test_b.py"}

    def config(keyword="", markexpr=""):
        return SimpleNamespace(option=SimpleNamespace(keyword=keyword, markexpr=markexpr))

    assert complete_run(config(), everything, tests)
    assert not complete_run(config(), {"tests/test_b.py"}, tests)
    assert not complete_run(config(keyword="fleet"), everything, tests)
    assert not complete_run(config(markexpr="not server"), everything, tests)


def test_a_complete_probed_run_that_missed_raises_ends_failed_and_a_partial_one_does_not(tmp_path, monkeypatch):
    """The controller's end of run: with the probe on and every module run, raises that ran in no process turn
    an otherwise green run red; the same record from a run of one module leaves its exit status alone."""
    import raise_record

    monkeypatch.setenv(DIR_ENV, str(tmp_path / "probe"))  # an empty probe directory: no process ran any raise
    monkeypatch.setattr(raise_record, "RECORD_FILE", tmp_path / "raise_record.json")
    every_module = {str(f.relative_to(TESTS.parent)) for f in TESTS.rglob("test_*.py")}
    config = SimpleNamespace(option=SimpleNamespace(keyword="", markexpr=""))
    for modules, status in ((every_module, pytest.ExitCode.TESTS_FAILED), ({"tests/unit/test_rows.py"},
                                                                           pytest.ExitCode.OK)):
        controller = Controller(RaiseRecord())
        controller.modules_run = modules
        session = SimpleNamespace(config=config, exitstatus=pytest.ExitCode.OK)
        controller.pytest_sessionfinish(session)
        assert session.exitstatus == status
        assert controller.gated == (status == pytest.ExitCode.TESTS_FAILED)
        assert json.loads((tmp_path / "raise_record.json").read_text())["counts"]["not executed"] > 0
