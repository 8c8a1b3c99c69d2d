"""The verl path: preference pairs from a rollout batch, the RM step as a verl worker method
(real Ray worker group, ``@register`` dispatch), and the publish hook after it: the in-process tests (no server; those on the real server: tests/integration/online/test_hook.py)."""

from __future__ import annotations
import pytest
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
