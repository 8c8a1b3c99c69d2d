"""``MultiServerPublisher``: one publisher per server, kept between publishes, one result per server: the in-process tests (no server; those on the real server: tests/integration/weight_sync/test_publish_all.py)."""

from __future__ import annotations

import pytest
from verl_vllm_rm.weight_sync import MultiServerPublisher


def test_managed_replicas_none_of_which_can_be_opened_fail_the_publish(dead_url):
    from verl_vllm_rm.weight_sync import WeightSyncError

    with pytest.raises(WeightSyncError, match=rf"^no server could take weight updates \({dead_url}: HttpError: .*\); "
                                              r"every server serves its old version$"):
        MultiServerPublisher([dead_url], on_commit=lambda version: None, timeout_s=5)
