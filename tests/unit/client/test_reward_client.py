"""``VLLMRewardClient`` (``client/reward_client.py``) where no server answers: what it refuses, a source of servers
that fails or lists none, and a fresh client's view of its servers (which it routes to: test_endpoints.py; the client
against the real server, with faults injected by a loopback proxy: tests/integration/client/test_reward_client.py)."""

from __future__ import annotations

import numpy as np
import pytest
from client_calls import FAST, run

from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.client.reward_client import RewardServerError, VLLMRewardClient
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
