"""``VLLMRewardClient`` (``client/reward_client.py``) where no server answers: what it refuses, a source of servers
that fails or lists none, which servers it routes to by the weight version each is known to serve
(:func:`on_newest_version`: pure logic over the client's view of its servers), and a fresh client's view (the client
against the real server, with faults injected by a loopback proxy: tests/integration/client/test_reward_client.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from client_calls import FAST, run

from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.client.reward_client import RewardServerError, VLLMRewardClient, _Endpoint, on_newest_version
from verl_vllm_rm.scoring.options import ConfigError


def test_bad_options_are_clear():
    with pytest.raises(ConfigError, match="unknown reward_kwargs option.*valid options are"):
        VLLMRewardClient("http://127.0.0.1:1", retries=3)
    with pytest.raises(ConfigError, match="max_retries must be an integer"):
        VLLMRewardClient("http://127.0.0.1:1", max_retries="3")
    with pytest.raises(ConfigError, match=r"failover_after_s must be > 0, got 0"):
        VLLMRewardClient("http://127.0.0.1:1", failover_after_s=0)
    with pytest.raises(ConfigError, match=r"health_timeout_s must be > 0, got -1"):
        VLLMRewardClient("http://127.0.0.1:1", health_timeout_s=-1)
    with pytest.raises(TypeError, match="all strings or all token-id lists"):
        client = VLLMRewardClient("http://127.0.0.1:1")
        run(client, client.score_batch(["a", [1]]))
    with pytest.raises(TypeError, match=r"pass either options=ClientOptions\(\.\.\.\) or keyword options, not both"):
        VLLMRewardClient("http://127.0.0.1:1", options=ClientOptions())


def test_a_source_that_fails_before_any_server_is_named(texts):
    async def source():
        raise RuntimeError("fleet vllm_rm_replicas_rm: replica 0 did not start")

    client = VLLMRewardClient(max_retries=0, **FAST)
    client.follow(source)
    with pytest.raises(RewardServerError, match="the reward servers' source failed: fleet vllm_rm_replicas_rm: "
                                                "replica 0 did not start"):
        run(client, client.score_batch([[1, 2, 3]]))


def test_a_source_that_lists_no_server_yet_is_retried_then_reported():
    """A followed source that lists no server (managed replicas still starting, or all out of routing): each
    attempt asks it again, and the error says that no server was in routing, not a connection failure."""
    asked = []

    async def source():
        asked.append(1)
        return []

    client = VLLMRewardClient(max_retries=2, **FAST)
    client.follow(source, refresh_s=0.0)
    with pytest.raises(RewardServerError, match=r"after 3 attempt\(s\), max_retries 2 used up \(servers \[\]\); last "
                                                r"error: \(no server\): no reward server in routing yet: the followed "
                                                r"source lists none"):
        run(client, client.score_batch([[1, 2, 3]]))
    assert len(asked) == 3


def endpoint(name: str, version: int | None, read_at: float = -math.inf) -> _Endpoint:
    return _Endpoint(f"http://{name}", version=version, version_read=read_at)


def names(endpoints: list[_Endpoint]) -> list[str]:
    return [e.url.removeprefix("http://") for e in endpoints]


def test_servers_whose_version_is_not_known_are_routed():
    routable, to_check = on_newest_version([endpoint("a", None), endpoint("b", None)], -math.inf, 10.0, 5.0)
    assert (names(routable), to_check) == (["a", "b"], [])


def test_a_server_behind_gets_no_request_until_its_health_is_due():
    """b was seen on version 2 after a was first seen on 3 (at t=5): behind, and its version was read at t=6, so
    it is asked again only 5 s later; one read before a showed version 3 is due at once."""
    servers = [endpoint("a", 3, read_at=9.0), endpoint("b", 2, read_at=6.0), endpoint("c", None)]
    assert [names(x) for x in on_newest_version(servers, 5.0, 10.0, 5.0)] == [["a", "c"], []]
    assert [names(x) for x in on_newest_version(servers, 5.0, 11.5, 5.0)] == [["a", "c"], ["b"]]
    servers[1].version_read = 4.0  # read before a was seen on version 3
    assert [names(x) for x in on_newest_version(servers, 5.0, 10.0, 5.0)] == [["a", "c"], ["b"]]


def test_the_newest_version_is_that_of_the_servers_up():
    """Without the server on version 3 (down, so not passed), the one on 2 is the newest: it serves."""
    assert names(on_newest_version([endpoint("b", 2, read_at=6.0)], 5.0, 10.0, 5.0)[0]) == ["b"]
    restarted = [endpoint("a", 0, read_at=9.0), endpoint("b", 0, read_at=9.5)]  # both restarted from disk
    assert names(on_newest_version(restarted, 5.0, 10.0, 5.0)[0]) == ["a", "b"]


def test_a_fresh_client_routes_over_its_urls_without_their_trailing_slash_and_has_sent_nothing():
    client = VLLMRewardClient(["http://a:1/", "https://b:2"])
    assert client.urls == ["http://a:1", "https://b:2"]
    zero = {"requests": 0, "outstanding": 0, "failures": 0, "failovers": 0, "hangs": 0, "latency_ms": 0.0,
            "cooldown_left_s": 0.0}
    assert client.endpoint_stats() == {"http://a:1": zero, "https://b:2": zero}
    client.follow(lambda: None)  # a followed source replaces the fixed list (asked at the first request)
    assert client.urls == [] and client.endpoint_stats() == {}


def test_nothing_to_score_sends_no_request_and_bad_inputs_are_refused_before_one(dead_url):
    client = VLLMRewardClient(dead_url, max_retries=0, **FAST)
    assert run(client, client.score_batch([])) == []
    empty = run(client, client.score_request([]))
    assert len(empty) == 0
    assert client.endpoint_stats()[dead_url]["requests"] == 0
    with pytest.raises(TypeError, match="all strings or all token-id lists"):
        run(client, client.score_request([np.array([1.0, 2.0])]))  # a float array is not token ids
    with pytest.raises(TypeError, match="all strings or all token-id lists"):
        run(client, client.score_request([np.array([[1, 2]])]))  # nor a 2-D one
