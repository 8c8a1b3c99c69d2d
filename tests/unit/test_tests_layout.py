"""The tests' own layout: tests/unit (in-process), tests/integration (real server, Ray, main_ppo), tests/support
(what both share), and nothing loose beside them; a unit test that starts a component is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
from repo_paths import PACKAGE, REPO, TESTS

ROOMS = {"unit", "integration", "support"}


def test_every_test_module_is_in_unit_or_integration():
    loose = [p.relative_to(TESTS) for p in TESTS.rglob("test_*.py") if p.relative_to(TESTS).parts[0] not in
             {"unit", "integration"}]
    assert not loose, f"test modules outside tests/unit and tests/integration: {loose}"
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"} == ROOMS


def test_a_unit_test_that_starts_the_server_or_main_ppo_is_refused():
    from unit_guard import StartsAComponent

    for module in ("verl_vllm_rm.server", "verl.trainer.main_ppo"):
        with pytest.raises(StartsAComponent, match=rf"^a unit test started {module}: move it to tests/integration$"):
            subprocess.Popen([sys.executable, "-m", module, "--help"])
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout == "1\n"


def test_a_unit_test_that_starts_ray_is_refused():
    import ray

    from unit_guard import StartsAComponent

    with pytest.raises(StartsAComponent, match=r"^a unit test started Ray \(ray\.init\): move it to tests/integration$"):
        ray.init()


#: Package modules whose tests cannot sit in a file of their own name, with where they are tested and why.
TESTED_UNDER_OTHER_NAMES = {
    "dev/cpu_harness/rm_step_gate.py": ("tests/integration/dev/test_tiny_ppo_any_rm.py",
                                        "it holds verl's online trainer until TransferQueue lists a finished group"),
    "dev/cpu_harness/rm_step_log.py": ("tests/integration/dev/test_tiny_ppo_any_rm.py",
                                       "it wraps the RM step of a running online trainer (verl's RM engine)"),
    "dev/reference_docs/server_flags.py": ("tests/integration/test_cli.py",
                                           "it runs the server environment's interpreter (vLLM)"),
    "replicas/replica.py": ("tests/integration/replicas/test_fleet.py", "the Ray actor that owns a server process"),
    "server/weights/apply.py": ("tests/integration/weight_sync/test_modes.py",
                                "it applies an update inside vLLM's engine (also test_two_phase and "
                                "test_reload_rollback)"),
    "server/weights/worker_extension.py": ("tests/integration/weight_sync/test_tensor_parallel.py",
                                           "it runs in vLLM's workers (also test_transfer_stalls, test_faults)"),
}


def has_logic(path) -> bool:
    """A function, or a class with a method: constants, re-exports and plain records have no test of their own."""
    import ast

    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.walk(tree))


def test_every_package_module_with_logic_has_a_test_file_of_its_name():
    """``verl_vllm_rm/<dir>/<name>.py`` is tested in ``tests/unit/<dir>/test_<name>.py`` (in process) or
    ``tests/integration/<dir>/test_<name>.py``, or listed above with where and why."""
    missing, stale = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py") or not has_logic(path):
            continue
        module = path.relative_to(PACKAGE)
        own = [TESTS / room / module.parent / f"test_{module.name}" for room in ("unit", "integration")]
        if any(p.exists() for p in own):
            stale += [str(module)] if str(module) in TESTED_UNDER_OTHER_NAMES else []
        elif str(module) not in TESTED_UNDER_OTHER_NAMES:
            missing.append(str(module))
    assert not missing, f"modules with no test file of their name (add tests/unit/<dir>/test_<name>.py): {missing}"
    assert not stale, f"listed in TESTED_UNDER_OTHER_NAMES but tested under their own name now: {stale}"
    for module, (test_file, _) in TESTED_UNDER_OTHER_NAMES.items():
        assert (REPO / test_file).exists() and (PACKAGE / module).exists(), (module, test_file)
