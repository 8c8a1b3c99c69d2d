"""The environment a CPU run gives the processes it starts (``dev/cpu_names.py``)."""

from __future__ import annotations

from verl_vllm_rm.dev.cpu_names import CPU_RUN_ENV, cpu_run_env

VARIABLES = ("OMP_WAIT_POLICY", "VLLM_ENABLE_V1_MULTIPROCESSING")


def test_a_cpu_runs_processes_wait_passively_and_its_servers_run_their_worker_in_the_engine_core(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert cpu_run_env() == CPU_RUN_ENV == {"OMP_WAIT_POLICY": "PASSIVE", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def test_each_variable_the_user_set_wins(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    assert cpu_run_env() == {"OMP_WAIT_POLICY": "ACTIVE", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert cpu_run_env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_main_ppo_of_a_tiny_run_gets_it(monkeypatch, tmp_path):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, main_ppo_env

    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    env = main_ppo_env(TinyPPOConfig(tmp_path))
    assert {name: env[name] for name in VARIABLES} == CPU_RUN_ENV
