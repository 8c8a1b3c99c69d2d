"""``step_reward=token``'s per-token rewards (``plugin/token_placement.py``) as a trajectory's TransferQueue row
holds them (writing them into ``rm_scores`` in a real TransferQueue:
tests/integration/plugin/test_metrics_trainer_mode.py::test_token_rewards_are_written_into_rm_scores_where_they_fit)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.plugin.token_placement import token_rewards_of


@pytest.mark.parametrize("row, rewards", [
    ({"reward_extra_info": {"token_rewards": [0.25, 0, 1]}}, [0.25, 0.0, 1.0]),
    ({"reward_extra_info": {"token_rewards": [[0.5, 1.5]]}}, [0.5, 1.5]),  # a backend's one-element wrapping
    ({"reward_extra_info": {"token_rewards": (2,)}}, [2.0]),
    ({"reward_extra_info": {"token_rewards": None}}, None),
    ({"reward_extra_info": {"rm_score": 0.5}}, None),
    ({"other": 1}, None),
    ("not a row", None),
])
def test_a_rows_token_rewards_are_floats_or_none(row, rewards):
    assert token_rewards_of(row) == rewards
