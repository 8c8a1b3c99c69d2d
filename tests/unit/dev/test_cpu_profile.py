"""The CPU profile (``dev/cpu_profile.py``): the Hydra overrides that make a GRPO ``main_ppo`` run a tiny one on CPU,
for each trainer mode, online or not, and its command line that prints them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl_vllm_rm.dev.cpu_names import BACKEND_NAME
from verl_vllm_rm.dev.cpu_profile import (CPU_OVERRIDES, CPU_RM_ENGINE, SEPARATE_ASYNC_OVERRIDES, cpu_profile)


def test_the_cpu_profile_of_an_unknown_trainer_mode_is_refused():
    from verl_vllm_rm.dev.cpu_profile import cpu_profile

    with pytest.raises(ValueError, match=r"the trainer mode must be one of \('sync', 'colocate_async', "
                                         r"'separate_async'\), got 'fully_async'"):
        cpu_profile(1, mode="fully_async")


def settings(profile: list[str]) -> dict[str, str]:
    """``key=value`` overrides as a dict (a key given twice: the last wins, as in Hydra)."""
    return dict(o.split("=", 1) for o in profile)


def test_a_sync_profile_is_the_cpu_overrides_then_the_runs_size():
    profile = cpu_profile(3, batch_prompts=2, group_size=5)
    assert profile[:len(CPU_OVERRIDES)] == CPU_OVERRIDES
    given = settings(profile)
    assert given["actor_rollout_ref.rollout.name"] == BACKEND_NAME == "hf_cpu"
    assert given["+ray_kwargs.ray_init.num_gpus"] == "1"
    assert (given["data.train_batch_size"], given["actor_rollout_ref.actor.ppo_mini_batch_size"]) == ("2", "2")
    assert given["actor_rollout_ref.rollout.n"] == "5" and given["trainer.total_training_steps"] == "3"
    assert not set(SEPARATE_ASYNC_OVERRIDES) & set(profile)
    assert not [o for o in profile if "online_rm" in o or "VERL_USE_EXTERNAL_MODULES" in o]


def test_separate_async_takes_a_second_worker_slot_and_syncs_over_cpu_gloo():
    given = settings(cpu_profile(1, mode="separate_async"))
    assert given["+ray_kwargs.ray_init.num_gpus"] == "2"
    assert given["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "cpu_gloo"
    assert given["trainer.v1.separate_async.parameter_sync_step"] == "1"
    assert settings(cpu_profile(1, mode="colocate_async"))["+ray_kwargs.ray_init.num_gpus"] == "1"


def test_an_online_profile_gives_the_rm_trainer_the_cpu_engine():
    profile = cpu_profile(1, online=True)
    assert profile[-len(CPU_RM_ENGINE):] == ["+online_rm.use_gpu=False", "+online_rm.use_remove_padding=False",
                                             "+online_rm.attn_implementation=sdpa", "+online_rm.param_dtype=fp32"]


def test_external_modules_reach_rays_runtime_env_last():
    profile = cpu_profile(1, external_modules="verl_vllm_rm.dev.cpu_harness.activate,my.module")
    assert profile[-1] == ("++ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES="
                           "'verl_vllm_rm.dev.cpu_harness.activate,my.module'")


def run_cli(*args: str, modules: str = "") -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": modules}
    return subprocess.run([sys.executable, "-m", "verl_vllm_rm.dev.cpu_profile", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_command_prints_the_profile_one_override_a_line():
    run = run_cli()
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == cpu_profile(2)  # two steps when none is given
    online = run_cli("4", "trainer.v1.trainer_mode=vllm_rm_online", modules="verl_vllm_rm.dev.cpu_harness.activate")
    assert online.stdout.splitlines() == cpu_profile(4, online=True,
                                                     external_modules="verl_vllm_rm.dev.cpu_harness.activate")


def test_the_command_refuses_steps_that_are_not_a_number():
    run = run_cli("many")
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith("usage: python -m verl_vllm_rm.dev.cpu_profile [STEPS [OVERRIDE ...]]")


def test_a_cpu_profile_of_no_step_is_refused():
    """VERL_VLLM_RM_CPU_STEPS=0 would be a run that trains nothing: the profile refuses it (the recipe then stops
    with "could not build the CPU profile")."""
    run = run_cli("0")
    assert run.returncode == 1 and run.stdout == ""
    assert "STEPS must be at least 1, got 0 (VERL_VLLM_RM_CPU_STEPS in the recipes): a run of no step" in run.stderr
