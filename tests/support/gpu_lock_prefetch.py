"""The GPU quick start's resolutions, started when a ``make test`` run starts, in pytest-xdist's controller.

``tests/integration/dev/test_gpu_lock.py`` has pip resolve the quick start's two GPU install lines from the package
index: about two minutes, nearly all of it pip waiting on the index (a few hundred metadata requests one after
another, ~25 CPU-seconds a line). On a worker that wait held the worker for the module's 2.8 minutes. xdist's
controller process only hands out modules and collects reports, so it runs them from the start of the run instead
(a thread; pip itself in subprocesses) and the module reads what they gave: by the time a worker reaches it the
wait has overlapped other modules.

The controller starts them only when the run takes in the module (its path under one of the run's arguments, no
``-k``, no marker expression that could leave out ``server`` tests); otherwise, and without xdist, the module
resolves itself, as before. The result travels in a directory the controller names to its workers
(``workerinput``) and removes at the end of the session.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from process_helpers import wait_until
from quick_start_lines import ENVIRONMENTS, gpu_section, pip_lines
from repo_paths import REPO as ROOT

MODULE = ROOT / "tests" / "integration" / "dev" / "test_gpu_lock.py"
WORKER_KEY = "gpu_lock_prefetch_dir"
RESULT = "resolved.json"
#: the longest a worker waits for the controller's result (its own resolution took ~2-3 minutes under load)
WAIT_S = 900.0


def first_installs() -> dict[str, list[str]]:
    """Each GPU environment's first install line of the quick start, by its extra (what pip resolves)."""
    return {ENVIRONMENTS[env]: installs[0] for env, installs in pip_lines(gpu_section()).items()}


def resolve_lines(directory: Path) -> dict:
    """The resolver's python and each first install line resolved by it, side by side; raises with pip's words."""
    from concurrent.futures import ThreadPoolExecutor

    from verl_vllm_rm.dev.gpu_lock import resolve, resolver_python

    resolver = resolver_python(directory / "resolver")
    with ThreadPoolExecutor(2) as pool:
        futures = {extra: pool.submit(resolve, args, resolver) for extra, args in first_installs().items()}
        return {"resolver": str(resolver), "sets": {extra: f.result() for extra, f in futures.items()}}


def _prefetch(directory: Path) -> None:
    try:
        result = resolve_lines(directory)
    except RuntimeError as err:  # the worker raises it again (prefetched)
        result = {"error": str(err)}
    partial = directory / (RESULT + ".part")
    partial.write_text(json.dumps(result))
    partial.replace(directory / RESULT)  # whole or absent: a worker never reads half of it


def takes_in_the_module(config: pytest.Config) -> bool:
    """The run's arguments include the module (a path above or at it), with nothing that could deselect it."""
    if config.option.keyword or config.option.markexpr:
        return False
    paths = [Path(config.invocation_params.dir, arg.split("::")[0]).resolve() for arg in config.args]
    return any(path == MODULE or path in MODULE.parents for path in paths)


class Prefetch:
    """Started at the first worker's set-up in the controller; its directory goes to every worker."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.thread: threading.Thread | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="gpu-lock-"))
            self.thread = threading.Thread(target=_prefetch, args=(self.directory,), name="gpu-lock-prefetch",
                                           daemon=True)
            self.thread.start()
        node.workerinput[WORKER_KEY] = str(self.directory)

    def pytest_sessionfinish(self) -> None:
        if self.thread is not None:
            self.thread.join()  # pip's subprocesses end with it; the module has read the result by now
            shutil.rmtree(self.directory, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    in_controller = config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")
    if in_controller and (config.getoption("numprocesses", None) or 0) and takes_in_the_module(config):
        config.pluginmanager.register(Prefetch(), "gpu_lock_prefetch_controller")


def prefetched(config: pytest.Config) -> dict | None:
    """The controller's result for this worker (None: no prefetch in this run); raises with pip's words when a
    resolution failed, as the module's own resolution would."""
    directory = getattr(config, "workerinput", {}).get(WORKER_KEY)
    if directory is None:
        return None
    result = Path(directory) / RESULT
    wait_until(result.exists, WAIT_S, f"the controller's GPU lock resolutions wrote {result}")
    answer = json.loads(result.read_text())
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer
