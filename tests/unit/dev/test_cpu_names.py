"""The environment a CPU run gives the processes it starts (``dev/cpu_names.py``)."""

from __future__ import annotations

from verl_vllm_rm.dev.cpu_names import SHARED_CORES_ENV, shared_cores_env


def test_a_cpu_runs_processes_wait_passively_unless_the_user_set_otherwise(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert shared_cores_env() == SHARED_CORES_ENV == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert shared_cores_env() == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_main_ppo_of_a_tiny_run_gets_it(monkeypatch, tmp_path):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, main_ppo_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert main_ppo_env(TinyPPOConfig(tmp_path))["OMP_WAIT_POLICY"] == "PASSIVE"
