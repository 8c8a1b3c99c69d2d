"""``MultiServerPublisher`` (``weight_sync.multi_server``) in process, no server: one publisher per server, kept
between publishes, one result per server; refused set-ups raise before any tensor moves (those on the real server:
tests/integration/weight_sync/test_multi_server.py, tests/integration/weight_sync/test_refusals.py)."""

from __future__ import annotations

import logging
import threading

import pytest
from log_records import messages_of

from verl_vllm_rm.protocol.inventory import WeightUpdateRefused
from verl_vllm_rm.weight_sync import MultiServerPublisher
from verl_vllm_rm.weight_sync.multi_server import close_quietly, results_or_errors, servers_on_every_rank
from verl_vllm_rm.weight_sync.transfer import WeightSyncError


def test_managed_replicas_none_of_which_can_be_opened_fail_the_publish(dead_url):
    from verl_vllm_rm.weight_sync import WeightSyncError

    with pytest.raises(WeightSyncError, match=rf"^no server could take weight updates \({dead_url}: HttpError: .*\); "
                                              r"every server serves its old version$"):
        MultiServerPublisher([dead_url], on_commit=lambda version: None, timeout_s=5)


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


@pytest.mark.parametrize("parallel", [False, True])
def test_each_servers_result_or_error_is_kept_by_its_url(parallel):
    def open_one(arg: int) -> str:
        if arg < 0:
            raise ConnectionError(f"refused {arg}")
        return f"opened {arg} on {threading.current_thread().name}"

    results = results_or_errors(open_one, {"http://a": 1, "http://b": -2, "http://c": 3}, parallel=parallel)
    assert list(results) == ["http://a", "http://b", "http://c"]
    assert isinstance(results["http://b"], ConnectionError) and str(results["http://b"]) == "refused -2"
    threads = {results[url].split(" on ")[1] for url in ("http://a", "http://c")}
    assert (threads == {threading.current_thread().name}) is not parallel  # in parallel: the pool's threads
    assert results_or_errors(open_one, {}, parallel=parallel) == {}


def test_a_trainer_of_one_rank_keeps_every_server_it_opened():
    assert servers_on_every_rank({"http://a", "http://b"}, None) == {"http://a", "http://b"}


def test_a_version_refused_everywhere_is_a_refusal_and_any_other_failure_a_sync_error():
    refused = {"http://a": WeightUpdateRefused("too big"), "http://b": WeightUpdateRefused("bad shape")}
    error = MultiServerPublisher._error(refused, 7, "every server serves version 6")
    assert type(error) is WeightUpdateRefused
    assert str(error) == ("version 7 failed on 2 server(s) (http://a: WeightUpdateRefused: too big; http://b: "
                          "WeightUpdateRefused: bad shape); every server serves version 6")
    mixed = {"http://a": WeightUpdateRefused("too big"), "http://b": TimeoutError("hung")}
    error = MultiServerPublisher._error(mixed, 7, "aborted")
    assert type(error) is WeightSyncError and "http://b: TimeoutError: hung); aborted" in str(error)


def test_a_session_that_cannot_be_closed_is_logged_not_raised(caplog):
    class Unreachable:
        def close(self) -> None:
            raise ConnectionError("connection refused")

    with caplog.at_level(logging.WARNING, logger="verl_vllm_rm.weight_sync.multi_server"):
        close_quietly("http://a", Unreachable())
    assert messages_of(caplog, "verl_vllm_rm.weight_sync.multi_server") == [
        "closing the weight-sync session of http://a: connection refused"]
