"""The raise probe (``tests/support/raise_probe.py``): a module of the watched package, imported in a process
where the probe is installed, records each raise the first time it runs, at the raise's own line, and runs as it
would without the probe."""

from __future__ import annotations

import importlib
import sys
import traceback

import pytest
from raise_probe import install, instrumented, seen_lines

SOURCE = (
    "def check(x):\n"
    "    if x < 0:\n"
    "        raise ValueError(\n"
    "            f'x must be >= 0, got {x}')\n"
    "    try:\n"
    "        raise KeyError('caught inside')\n"
    "    except KeyError:\n"
    "        return x\n")


@pytest.fixture()
def probed_package(tmp_path):
    """``probe_pkg.mod`` (SOURCE) importable from ``tmp_path``, watched by a probe recording into ``tmp_path/rec``;
    the finder and the modules are gone afterwards."""
    (tmp_path / "probe_pkg").mkdir()
    (tmp_path / "probe_pkg" / "__init__.py").write_text("")
    (tmp_path / "probe_pkg" / "mod.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    finder = install(str(tmp_path / "rec"), package="probe_pkg")
    try:
        yield tmp_path / "rec"
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(tmp_path))
        for name in ("probe_pkg", "probe_pkg.mod"):
            sys.modules.pop(name, None)


def test_each_raise_is_recorded_once_at_its_line_and_the_module_behaves_as_written(probed_package):
    from probe_pkg.mod import check

    assert seen_lines(str(probed_package)) == set()  # importing ran no raise
    assert check(2) == 2  # a raise caught inside the module is a raise that ran
    assert seen_lines(str(probed_package)) == {("probe_pkg/mod.py", 6)}
    for _ in range(3):
        with pytest.raises(ValueError, match=r"^x must be >= 0, got -1$") as err:
            check(-1)
    assert traceback.extract_tb(err.value.__traceback__)[-1].lineno == 3  # the raise's line, as without the probe
    assert seen_lines(str(probed_package)) == {("probe_pkg/mod.py", 6), ("probe_pkg/mod.py", 3)}
    logs = list((probed_package / "seen").iterdir())
    assert len(logs) == 1 and logs[0].read_text().splitlines() == ["probe_pkg/mod.py:6", "probe_pkg/mod.py:3"]


def test_a_module_is_compiled_once_and_loaded_from_the_probes_cache_after(probed_package):
    first = importlib.import_module("probe_pkg.mod")
    cached = sorted((probed_package / "code").iterdir())
    assert len(cached) == 2  # the package's __init__ and mod
    mtimes = [f.stat().st_mtime_ns for f in cached]
    del sys.modules["probe_pkg.mod"]
    again = importlib.import_module("probe_pkg.mod")

    assert again is not first and again.check(1) == 1
    assert [f.stat().st_mtime_ns for f in sorted((probed_package / "code").iterdir())] == mtimes


def test_modules_outside_the_watched_package_are_not_instrumented(probed_package, tmp_path):
    (tmp_path / "probe_pkg_sibling.py").write_text(SOURCE)  # a name that starts like the package's, outside it
    try:
        sibling = importlib.import_module("probe_pkg_sibling")
        with pytest.raises(ValueError, match="x must be >= 0, got -1"):
            sibling.check(-1)
    finally:
        sys.modules.pop("probe_pkg_sibling", None)
    assert not hasattr(sibling, "__verl_vllm_rm_raise_probe__")
    assert seen_lines(str(probed_package)) == set()


def test_the_instrumented_code_keeps_every_line_number():
    code = instrumented(SOURCE, "mod.py")
    check = next(c for c in code.co_consts if hasattr(c, "co_name") and c.co_name == "check")
    plain = next(c for c in compile(SOURCE, "mod.py", "exec").co_consts if hasattr(c, "co_name"))
    assert {line for *_, line in check.co_lines() if line} == {line for *_, line in plain.co_lines() if line}
