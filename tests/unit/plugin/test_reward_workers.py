"""Reaching into verl's reward-loop workers (the whitening checkpoint through real Ray workers: test_tiny_ppo_online.py)."""

import types

import pytest

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.plugin.reward_workers import manager_of, on_every_worker


def test_a_worker_without_vllm_rms_manager_is_named():
    worker = types.SimpleNamespace(reward_manager=object())
    with pytest.raises(ConfigError, match="holds object, not vllm_rm's manager"):
        manager_of(worker)


def test_no_workers_no_ray():
    assert on_every_worker([], manager_of) == []  # would otherwise start a Ray cluster
