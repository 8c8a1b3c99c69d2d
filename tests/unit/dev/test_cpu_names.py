"""The environment a CPU run gives the processes it starts (``dev/cpu_names.py``)."""

from __future__ import annotations

from verl_vllm_rm.dev.cpu_names import CPU_RUN_ENV, cpu_run_env

VARIABLES = ("OMP_WAIT_POLICY", "VLLM_ENABLE_V1_MULTIPROCESSING", "RAY_prestart_worker_first_driver")


def test_a_cpu_runs_processes_wait_passively_its_servers_run_their_worker_in_the_engine_core_and_ray_prestarts_none(
        monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert cpu_run_env() == CPU_RUN_ENV == {"OMP_WAIT_POLICY": "PASSIVE", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                                            "RAY_prestart_worker_first_driver": "0"}


def test_each_variable_the_user_set_wins(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("RAY_prestart_worker_first_driver", raising=False)
    assert cpu_run_env() == {"OMP_WAIT_POLICY": "ACTIVE", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                             "RAY_prestart_worker_first_driver": "0"}
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert cpu_run_env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_main_ppo_of_a_tiny_run_gets_it(monkeypatch, tmp_path):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, main_ppo_env

    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    env = main_ppo_env(TinyPPOConfig(tmp_path))
    assert {name: env[name] for name in VARIABLES} == CPU_RUN_ENV


def test_make_test_gives_its_processes_every_variable():
    """``make test``'s recipe passes each variable (unless the caller set it), as tiny-ppo does."""
    import re

    from repo_paths import REPO

    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\ntest:"):].split("\n\n", 1)[0]
    for name, value in CPU_RUN_ENV.items():
        assert re.search(rf"^{name} \?= {value}$", makefile, re.M), name
        assert f"{name}=$({name})" in recipe, name
