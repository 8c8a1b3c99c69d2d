"""The tests' own layout: tests/unit (in-process), tests/integration (real server, Ray, main_ppo), tests/support
(what both share), and nothing loose beside them; a unit test that starts a component is refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
from repo_paths import TESTS

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
