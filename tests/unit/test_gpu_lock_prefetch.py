"""When xdist's controller resolves the GPU quick start's lines for the run, and how a worker reads what it gave
(tests/support/gpu_lock_prefetch.py; the resolutions themselves run in tests/integration/dev/test_gpu_lock.py)."""

from __future__ import annotations

import json
import types

import pytest
from gpu_lock_prefetch import MODULE, RESULT, WORKER_KEY, prefetched, takes_in_the_module
from repo_paths import REPO as ROOT


def run_config(*args: str, keyword: str = "", markexpr: str = "", cwd=ROOT):
    return types.SimpleNamespace(args=list(args), option=types.SimpleNamespace(keyword=keyword, markexpr=markexpr),
                                 invocation_params=types.SimpleNamespace(dir=cwd))


@pytest.mark.parametrize("args, takes", [
    ((str(ROOT / "tests"),), True),  # make test: the testpaths
    (("tests/integration",), True),
    (("tests/integration/dev/test_gpu_lock.py::test_x",), True),
    (("tests/unit",), False),
    (("tests/integration/server", "tests/unit"), False),
])
def test_the_controller_resolves_only_for_a_run_that_takes_in_the_module(args, takes):
    assert takes_in_the_module(run_config(*args)) is takes


@pytest.mark.parametrize("option", [{"keyword": "lock"}, {"markexpr": "not server"}])
def test_a_selection_by_keyword_or_marker_starts_nothing(option):
    assert not takes_in_the_module(run_config("tests", **option))


def test_the_module_path_is_the_gpu_lock_module():
    assert MODULE.is_file()


def test_a_worker_reads_the_controllers_result_or_its_error(tmp_path):
    assert prefetched(types.SimpleNamespace()) is None  # no xdist: the module resolves itself
    assert prefetched(types.SimpleNamespace(workerinput={})) is None  # xdist, no prefetch in this run
    worker = types.SimpleNamespace(workerinput={WORKER_KEY: str(tmp_path)})
    (tmp_path / RESULT).write_text(json.dumps({"resolver": "/r/bin/python", "sets": {"server-gpu": {"a": "1"}}}))
    assert prefetched(worker)["sets"] == {"server-gpu": {"a": "1"}}
    (tmp_path / RESULT).write_text(json.dumps({"error": "`pip install x` does not resolve:\nno x"}))
    with pytest.raises(RuntimeError, match=r"^`pip install x` does not resolve:\nno x$"):
        prefetched(worker)


def test_a_worker_gives_up_on_a_result_that_never_comes_naming_it(tmp_path, monkeypatch):
    import gpu_lock_prefetch

    monkeypatch.setattr(gpu_lock_prefetch, "WAIT_S", 0.0)
    worker = types.SimpleNamespace(workerinput={WORKER_KEY: str(tmp_path)})
    with pytest.raises(AssertionError, match=rf"^not within 0s: the controller's GPU lock resolutions wrote "
                                             rf"{tmp_path}/{RESULT}$"):
        prefetched(worker)
