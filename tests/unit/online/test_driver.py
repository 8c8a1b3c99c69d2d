"""The trainer-side handle of online RM training (``online/driver.py``) in-process: the pairs a step trains on, why a
step had none, the RM ranks' store port window, verl's gathered metrics as one number (the worker group on Ray:
tests/integration/plugin/test_online_mode.py, tests/integration/online/)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.driver import idle_message, master_port_range, mean_of, preference_pairs


def test_fewer_groups_with_a_gap_than_rm_workers_is_named():
    config = OnlineRMConfig(model_path="/rm", server_url="http://a:1")
    assert "only 1 of the 8 prompt groups had a reward gap, fewer than the 2 RM workers" in idle_message(
        config, 5, groups=8, found=1, workers=2)


def test_the_rm_ranks_store_port_window_lies_below_the_ephemeral_range():
    """The RM ranks' torch.distributed store listens on a port no outgoing connection can be given as its source
    (a port taken that way failed a worker's start with EADDRINUSE); windows drawn for two groups differ."""
    import random
    from pathlib import Path


    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    windows = [master_port_range(random.Random(seed)) for seed in range(50)]
    assert all(10000 <= low and high == low + 1000 and high <= ephemeral_low for low, high in windows)
    assert len({low for low, _ in windows}) > 40


def test_the_message_of_a_step_without_any_gap_names_the_pair_source_and_the_gap():
    config = OnlineRMConfig(model_path="/rm", server_url="http://a:1", min_reward_gap=0.5,
                            reward_key=["verifiable_score", "rm_scores"])
    message = idle_message(config, None, groups=4, found=0, workers=1)
    assert message.startswith("online RM: no preference pairs at this PPO step, so the RM did not train: in all 4 "
                              "prompt groups the best and worst responses are within online_rm.min_reward_gap=0.5 "
                              "on the pair source online_rm.reward_key=['verifiable_score', 'rm_scores']: ")
    assert "(actor_rollout_ref.rollout.n)" in message
    at_step = idle_message(config, 7, groups=4, found=0, workers=1)
    assert at_step.startswith("online RM: no preference pairs at PPO step 7, so the RM did not train: in all 4 ")


def test_pairs_are_trimmed_to_a_multiple_of_the_rm_ranks():
    """Three groups with a gap over two ranks: the first two pairs, each rank an equal share; one group over two
    ranks: none, and the pair sources stay for the message."""
    uids = ["a", "a", "b", "b", "c", "c"]
    sequences = [[1], [2], [3], [4], [5], [6]]
    rewards = [0.0, 1.0, 1.0, 0.0, 0.2, 0.9]
    assert preference_pairs(uids, sequences, rewards) == ([[2], [3], [6]], [[1], [4], [5]], [0, 0, 0])
    assert preference_pairs(uids, sequences, rewards, multiple_of=2) == ([[2], [3]], [[1], [4]], [0, 0])
    assert preference_pairs(uids, sequences, rewards, min_gap=0.8, multiple_of=1) == ([[2], [3]], [[1], [4]], [0, 0])
    assert preference_pairs(uids[:2], sequences[:2], rewards[:2], multiple_of=2) == ([], [], [0])


@pytest.mark.parametrize("value, mean", [
    (2, 2.0),
    ([1.0, 2.0, 6.0], 3.0),
    ([[1.0, 3.0], [4.0]], 3.0),  # per rank, then over the ranks: (2 + 4) / 2
    ((0.5, [1.5, 2.5]), 1.25),
])
def test_a_gathered_metric_is_the_mean_of_its_means(value, mean):
    assert mean_of(value) == pytest.approx(mean)
