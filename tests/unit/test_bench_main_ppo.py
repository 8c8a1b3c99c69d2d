"""``benchmarks/bench_main_ppo.py``'s configurations differ only in the reward within each trainer mode: the floor
(verl's ``naive`` manager) must not keep what reads ``vllm_rm``'s rewards (its reward_kwargs, our trainer mode) and
must keep the mode's own settings; the timed replay buffer is the one verl would pick for the mode."""

from __future__ import annotations

import importlib.util

import pytest
from repo_paths import REPO

BENCH = REPO / "benchmarks" / "bench_main_ppo.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_main_ppo", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_the_floor_is_the_same_run_with_verls_naive_manager_and_trainer(bench, tmp_path, mode):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    from verl_vllm_rm.dev.tiny_ppo import Inputs, TinyPPOConfig

    cfg = TinyPPOConfig(tmp_path, steps=2, mode=mode)
    inputs = Inputs(*(tmp_path / n for n in ("rm", "policy", "train.parquet", "val.parquet")))
    ours = bench.config_overrides("vllm_rm", cfg, inputs, "http://127.0.0.1:1", poll_interval=0.05)
    floor = bench.config_overrides("naive", cfg, inputs, "http://127.0.0.1:1", poll_interval=0.05)
    our_mode = "vllm_rm" if mode == "sync" else f"vllm_rm_{mode}"
    assert f"trainer.v1.trainer_mode={our_mode}" in ours and "reward.reward_manager.name=vllm_rm" in ours
    assert f"trainer.v1.trainer_mode={mode}" in floor and "reward.reward_manager.name=naive" in floor
    assert not [o for o in floor if "=vllm_rm" in o or o.startswith("+reward.reward_kwargs.")]
    # the same overrides in the same order, less the reward's kwargs; only the manager and trainer mode differ
    kept = [o for o in ours if not o.startswith("+reward.reward_kwargs.")]
    assert [o.split("=")[0] for o in kept] == [o.split("=")[0] for o in floor]
    swapped = ("trainer.v1.trainer_mode=", "reward.reward_manager.name=")
    assert [o for o in kept if not o.startswith(swapped)] == [o for o in floor if not o.startswith(swapped)]
    if mode == "separate_async":
        assert "trainer.v1.separate_async.parameter_sync_step=1" in floor

    sampler = bench.timed_sampler(mode)
    assert f"trainer.v1.sampler.custom_sampler.name={sampler.__name__}" in floor
    assert issubclass(sampler, ReplayBufferAsync) == (mode != "sync") and issubclass(sampler, ReplayBuffer)


def test_an_unknown_mode_is_refused_with_the_choices(bench):
    with pytest.raises(ValueError, match=r"unknown trainer mode 'async'.*separate_async.*--modes"):
        bench.timed_sampler("async")
    with pytest.raises(SystemExit):
        bench.main(["--modes", "sync,async"])


def test_the_ratios_compare_within_a_mode_and_within_a_reward(bench):
    def means(step, gen, exposed):
        return {"timing_s": {"timing_s/step": step, "timing_s/gen": gen}, "exposed_reward_s": exposed}

    ran = {"sync/vllm_rm": means(4.0, 2.0, 0.2), "sync/naive": means(2.0, 1.0, 0.1),
           "colocate_async/vllm_rm": means(3.0, 1.5, 0.3), "colocate_async/naive": means(1.5, 1.0, 0.1)}
    ratios = bench.ratios(ran, ["sync", "colocate_async"], ["vllm_rm", "naive"])
    assert ratios["vllm_rm_over_naive"]["colocate_async"] == pytest.approx(
        {"step": 2.0, "gen": 1.5, "exposed_reward": 3.0, "exposed_reward_minus_naive_s": 0.2})
    assert ratios["step_over_sync"] == {"vllm_rm": {"colocate_async": 0.75}, "naive": {"colocate_async": 0.75}}
    del ran["colocate_async/naive"]  # a failed run: no ratio rather than a wrong one
    assert bench.ratios(ran, ["colocate_async"], ["vllm_rm"])["vllm_rm_over_naive"]["colocate_async"]["step"] is None
