"""Configurations verl 0.9.1 accepts but routes away from ``vllm_rm`` are reported (the manager's own report of its
config is ``test_manager.py``'s ``test_misrouting_configs_are_reported``)."""

import pytest

from verl_vllm_rm.scoring.misrouted_config import warn_legacy_argv


def test_legacy_override_on_the_command_line_is_reported():
    with pytest.warns(UserWarning, match="main_ppo ignores"):
        assert warn_legacy_argv(["main_ppo.py", "reward_model.reward_manager=vllm_rm"])
    assert not warn_legacy_argv(["main_ppo.py", "reward.reward_manager.name=vllm_rm"])
