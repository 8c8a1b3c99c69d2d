"""Refused updates: a clear error before any tensor moves, and the old weights keep serving: the in-process tests (no server; those on the real server: tests/integration/weight_sync/test_refusals.py)."""

from __future__ import annotations
import pytest


def test_draining_on_a_parity_failure_needs_a_fleet_that_routes_by_version():
    """``on_parity_failure`` takes a server out of routing, which only servers routed by weight version (managed
    replicas, ``on_commit``) have: a fixed list is refused before any server is contacted."""
    from verl_vllm_rm.weight_sync import MultiServerPublisher

    with pytest.raises(ValueError, match=r"on_parity_failure drains a server from routing: it needs on_commit"):
        MultiServerPublisher(["http://127.0.0.1:9"], on_parity_failure=lambda url, reason: None)


@pytest.mark.parametrize("server_urls", [[], lambda: []], ids=["empty-list", "source-lists-none"])
def test_publishing_to_no_server_is_refused(server_urls):
    """No server to publish to (an empty list, or managed replicas none of which is in routing) is refused at
    once, not a publish that succeeds without reaching any server."""
    from verl_vllm_rm.weight_sync import MultiServerPublisher

    with pytest.raises(ValueError, match=r"^MultiServerPublisher needs at least one server URL, and server_urls gave "
                                         r"none: pass the servers' URLs \(with managed replicas, none is up"):
        MultiServerPublisher(server_urls)
