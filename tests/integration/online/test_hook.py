"""The verl path: preference pairs from a rollout batch, the RM step as a verl worker method
(real Ray worker group, ``@register`` dispatch), and the publish hook after it."""

from __future__ import annotations

import pytest
from sync_helpers import PARITY_ATOL, max_diff, reset_server, runtime_version, server_scores

from verl_vllm_rm.online.pairs import best_vs_worst_pairs
from repo_paths import REPO


def test_pairs_are_best_vs_worst_of_each_group(rollout):
    uids, sequences, rewards, expected = rollout
    assert sequences == expected
    chosen, rejected, sources = best_vs_worst_pairs(uids, sequences, rewards)
    assert chosen == [expected[4 * g + 1] for g in range(4)]  # first correct response of each group
    assert rejected == [expected[4 * g] for g in range(4)]  # first wrong one
    assert sources == [0] * 4
    assert best_vs_worst_pairs(uids, sequences, [1.0] * len(uids)) == ([], [], [])  # no gap, no signal


def test_a_group_that_ties_on_one_pair_source_takes_its_pair_from_the_next(rollout):
    """Sources in order of preference: group 0 ties on the first (all 1.0) and is decided by the second, where the
    longest response is best; the other groups by the first. A group that ties on every source has no pair."""
    uids, sequences, rewards, expected = rollout
    first = [1.0 if i < 4 else r for i, r in enumerate(rewards)]
    second = [float(len(s)) for s in sequences]
    chosen, rejected, sources = best_vs_worst_pairs(uids, sequences, [first, second])
    assert sources == [1, 0, 0, 0]
    longest, shortest = max(range(4), key=lambda i: (len(sequences[i]), -i)), min(range(4), key=lambda i: (len(
        sequences[i]), i))
    assert (chosen[0], rejected[0]) == (expected[longest], expected[shortest])
    assert chosen[1:] == [expected[4 * g + 1] for g in (1, 2, 3)]
    assert best_vs_worst_pairs(uids, sequences, [[1.0] * len(uids)] * 2) == ([], [], [])


def test_pairs_need_one_uid_sequence_and_reward_per_response(rollout):
    uids, sequences, rewards, _ = rollout
    with pytest.raises(ValueError, match=r"uids, sequences and rewards differ in length: 16, 15, 16; give one uid, "
                                         r"sequence and reward \(in each row of rewards\) per response"):
        best_vs_worst_pairs(uids, sequences[:-1], rewards)


def test_rm_step_worker_method_publishes_every_n_steps(ray_cluster, ws_server, tiny_rm, rollout, probe_ids):
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.driver import OnlineRewardModel

    reset_server(ws_server.url, tiny_rm)
    config = OnlineRMConfig.from_dict(dict(model_path=tiny_rm, server_url=ws_server.url, training_mode="lora",
                                           publish_every=2, lr=5e-3, lora_rank=4, timeout_s=60, parity_every=1,
                                           **CPU_RM_ENGINE))
    online = OnlineRewardModel(config)
    uids, sequences, rewards, _ = rollout
    start = runtime_version(ws_server.url)
    for step in range(1, 5):
        metrics = online.train_on_rollout(uids, sequences, rewards)
        assert metrics["rm/pairs"] == 4 and metrics["rm/bt_loss"] > 0
        trainer_scores = online.worker_group.reference_scores(probe_ids)[0]
        served = server_scores(ws_server.url, probe_ids)
        if step % 2 == 0:
            assert metrics["rm/published_version"] == start + step // 2
            assert metrics["rm/parity_max_abs_diff"] <= PARITY_ATOL  # the probe ran on the step's own pairs
            assert metrics["rm/parity_mult_error"] <= 1.05
            assert max_diff(served, trainer_scores) <= PARITY_ATOL
        else:
            assert "rm/published_version" not in metrics
            assert max_diff(served, trainer_scores) > 1e-3  # trained but not yet published
        assert runtime_version(ws_server.url) == start + step // 2


def test_online_rm_recipe_options_are_valid(compose_config):
    import os
    import subprocess

    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.plugin.online_mode import online_rm_config

    recipe = REPO / "recipes" / "grpo_math_online_rm.sh"
    env = dict(os.environ, VERL_VLLM_RM_DRY_RUN="1", RM_PATH="/models/rm")
    overrides = subprocess.run(["bash", str(recipe)], env=env, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    assert "trainer.v1.trainer_mode=vllm_rm_online" in overrides
    config = online_rm_config(compose_config(overrides))
    assert (config.model_path, config.training_mode, config.reward_key) == ("/models/rm", "lora", ["verifiable_score"])
    assert config.server_url == ["http://127.0.0.1:8001"], "the reward manager's server (the recipe's RM_URL)"
    with pytest.raises(ValueError, match="valid options"):
        OnlineRMConfig.from_dict({"model_path": "/models/rm", "server_url": "http://x", "learning_rate": 1e-5})
