"""The RM's verl worker (``online/worker.py``) in-process: how a rank's pairs split into micro-batches, and where a
publish goes from the options (the worker on verl's engine, 1 and 2 ranks, ``full`` and ``lora``:
tests/integration/online/test_engine_trainer.py; publishing to managed replicas: tests/integration/replicas/)."""

from __future__ import annotations

from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.worker import micro_batch_pairs, publish_targets


def test_micro_batches_split_a_ranks_pairs_evenly_and_never_exceed_the_option():
    assert [micro_batch_pairs(pairs, 4) for pairs in (1, 4, 6, 7, 8, 12)] == [1, 4, 3, 1, 4, 4]
    assert micro_batch_pairs(6, 1) == 1


def test_a_fixed_server_list_is_published_to_as_given_leaving_a_failed_one_behind_only_when_asked():
    fixed = OnlineRMConfig(model_path="/rm", server_url=["http://a:1", "http://b:2"])
    assert publish_targets(fixed) == {"server_urls": ["http://a:1", "http://b:2"], "leave_behind": False}
    leave = OnlineRMConfig(model_path="/rm", server_url=["http://a:1", "http://b:2"], on_server_failure="leave_behind")
    assert publish_targets(leave) == {"server_urls": ["http://a:1", "http://b:2"], "leave_behind": True}
