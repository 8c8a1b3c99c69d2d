"""``benchmarks/bench_main_ppo.py``'s two configurations differ only in the reward: the floor (verl's ``naive``
manager) must not keep what reads ``vllm_rm``'s rewards (its reward_kwargs, trainer mode ``vllm_rm``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_main_ppo.py"


def test_the_floor_is_the_same_run_with_verls_naive_manager_and_trainer(tmp_path):
    from verl_vllm_rm.dev.tiny_ppo import Inputs, TinyPPOConfig

    spec = importlib.util.spec_from_file_location("bench_main_ppo", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = TinyPPOConfig(tmp_path, steps=2)
    inputs = Inputs(*(tmp_path / n for n in ("rm", "policy", "train.parquet", "val.parquet")))
    ours = bench.config_overrides("vllm_rm", cfg, inputs, "http://127.0.0.1:1", poll_interval=0)
    floor = bench.config_overrides("naive", cfg, inputs, "http://127.0.0.1:1", poll_interval=0)
    assert "trainer.v1.trainer_mode=vllm_rm" in ours and "reward.reward_manager.name=vllm_rm" in ours
    assert "trainer.v1.trainer_mode=sync" in floor and "reward.reward_manager.name=naive" in floor
    assert not [o for o in floor if "=vllm_rm" in o or o.startswith("+reward.reward_kwargs.")]
    assert len(ours) - len(floor) == len([o for o in ours if o.startswith("+reward.reward_kwargs.")])
