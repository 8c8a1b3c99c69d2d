"""VLLMRewardClient against the real server, with faults injected by a loopback proxy."""

import asyncio
import time

import pytest

from verl_vllm_rm.scoring.client import RewardRequestError, RewardServerError, VLLMRewardClient
from verl_vllm_rm.scoring.options import ConfigError
from verl_vllm_rm.parity.reference import sequence_scores

FAST = dict(backoff_base_s=0.01, backoff_max_s=0.05)


def run(client, coro):
    async def main():
        try:
            return await coro
        finally:
            await client.close()

    return asyncio.run(main())


def test_text_and_token_ids_match_transformers(rm_server, tokenizer, hf_model, texts):
    client = VLLMRewardClient(rm_server.url)
    ids = [tokenizer(t).input_ids for t in texts[:12]]
    expected = sequence_scores(hf_model, ids)
    by_ids = run(client, client.score_batch(ids))
    by_text = run(client, client.score_batch(texts[:12]))
    assert max(abs(a - b) for a, b in zip(by_ids, expected)) < 1e-4
    assert max(abs(a - b) for a, b in zip(by_text, expected)) < 1e-4
    assert run(client, client.score(ids[3])) == pytest.approx(expected[3], abs=1e-4)


def test_budget_splits_requests_and_keeps_order(fault_proxy, tokenizer, hf_model, texts):
    client = VLLMRewardClient(fault_proxy.url, max_batch_seqs=3, max_batch_tokens=10_000)
    ids = [tokenizer(t).input_ids for t in texts[:10]]
    got = run(client, client.score_batch(ids))
    assert sum(r["path"] == "/score" for r in fault_proxy.requests) == 4  # 3+3+3+1
    assert max(abs(a - b) for a, b in zip(got, sequence_scores(hf_model, ids))) < 1e-4


def test_score_request_is_one_request_whatever_the_budget(fault_proxy, tokenizer, hf_model, texts):
    """The group batcher applies the budget itself: the chunk it hands over goes out as it is."""
    client = VLLMRewardClient(fault_proxy.url, max_batch_seqs=3, max_batch_tokens=10)
    ids = [tokenizer(t).input_ids for t in texts[:10]]
    got = run(client, client.score_request(ids))
    assert [r["path"] for r in fault_proxy.requests] == ["/score"]
    assert max(abs(a - b) for a, b in zip(got, sequence_scores(hf_model, ids))) < 1e-4


def test_token_budget_splits_requests(fault_proxy, tokenizer, texts):
    ids = [tokenizer(t).input_ids for t in texts[:6]]
    client = VLLMRewardClient(fault_proxy.url, max_batch_tokens=max(map(len, ids)))
    run(client, client.score_batch(ids))
    assert sum(r["path"] == "/score" for r in fault_proxy.requests) >= 3


def test_4xx_is_not_retried(fault_proxy):
    client = VLLMRewardClient(fault_proxy.url, max_retries=5, **FAST)
    with pytest.raises(RewardRequestError, match="HTTP 400.*longer than max_model_len"):
        run(client, client.score_batch([[5] * 600]))
    assert len(fault_proxy.requests) == 1


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_errors_are_retried(fault_proxy, texts, status):
    fault_proxy.faults.fail_status, fault_proxy.faults.fail_times = status, 2
    client = VLLMRewardClient(fault_proxy.url, max_retries=3, **FAST)
    scores = run(client, client.score_batch(texts[:2]))
    assert len(scores) == 2 and len(fault_proxy.requests) == 3


def test_retries_exhausted_names_server_and_cause(fault_proxy, texts):
    fault_proxy.faults.fail_status, fault_proxy.faults.fail_times = 503, 100
    client = VLLMRewardClient(fault_proxy.url, max_retries=2, **FAST)
    with pytest.raises(RewardServerError, match=r"after 3 attempt\(s\).*HTTP 503") as err:
        run(client, client.score_batch(texts[:2]))
    assert fault_proxy.url in str(err.value)


@pytest.mark.parametrize("kind", ["nan", "count", "nonjson", "index", "truncated"])
def test_corrupt_responses_are_errors_not_numbers(fault_proxy, texts, kind):
    fault_proxy.faults.corrupt = kind
    client = VLLMRewardClient(fault_proxy.url, max_retries=1, **FAST)
    with pytest.raises(RewardServerError):
        run(client, client.score_batch(texts[:3]))
    assert len(fault_proxy.requests) == 2


def test_read_timeout_is_honoured(fault_proxy, texts):
    fault_proxy.faults.delay_s = 5.0
    client = VLLMRewardClient(fault_proxy.url, read_timeout_s=0.3, max_retries=1, **FAST)
    with pytest.raises(RewardServerError, match="timed out"):
        run(client, client.score_batch(texts[:1]))


def test_deadline_bounds_the_whole_call(fault_proxy, texts):
    fault_proxy.faults.delay_s = 5.0
    client = VLLMRewardClient(fault_proxy.url, deadline_s=1.0, max_retries=50, **FAST)
    t0 = time.monotonic()
    with pytest.raises(RewardServerError):
        run(client, client.score_batch(texts[:1]))
    assert time.monotonic() - t0 < 4.0  # well before a single 5 s answer


def test_dropped_connection_is_retried_then_reported(fault_proxy, texts):
    fault_proxy.faults.drop = True
    client = VLLMRewardClient(fault_proxy.url, max_retries=2, **FAST)
    with pytest.raises(RewardServerError, match="attempt"):
        run(client, client.score_batch(texts[:1]))
    assert len(fault_proxy.requests) == 3


@pytest.mark.parametrize("failing", ["dead", "slow"])
def test_failover_to_a_live_server(failing, dead_url, fault_proxy, rm_server, tokenizer, hf_model, texts):
    """A retry goes to another server: a dead one refuses at once, a slow one outlives read_timeout."""
    fault_proxy.faults.delay_s = 3.0  # unused by the dead case
    bad = dead_url if failing == "dead" else fault_proxy.url
    # one retry only, one sequence per request: every request that met the bad server must fail over
    client = VLLMRewardClient([bad, rm_server.url], max_retries=1, read_timeout_s=0.5, max_batch_seqs=1, **FAST)
    ids = [tokenizer(t).input_ids for t in texts[:8]]
    expected = sequence_scores(hf_model, ids)
    for _ in range(2):
        got = run(client, client.score_batch(ids))
        assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-4
    if failing == "slow":
        assert len(fault_proxy.requests) >= 4  # least-outstanding sent half of the first round there


def test_least_outstanding_routing_spreads_load(rm_server, texts):
    from fault_proxy import FaultProxy

    a, b = FaultProxy(rm_server.url).start(), FaultProxy(rm_server.url).start()
    try:
        a.faults.delay_s = b.faults.delay_s = 0.2
        client = VLLMRewardClient([a.url, b.url], max_batch_seqs=1)
        run(client, client.score_batch(texts[:8]))
        assert len(a.requests) >= 3 and len(b.requests) >= 3
    finally:
        a.stop(), b.stop()


def test_api_key_header_and_model_version(fault_proxy):
    client = VLLMRewardClient(fault_proxy.url, api_key="k-123")
    assert run(client, client.get_model_version()) == 0
    assert fault_proxy.requests[0]["headers"]["Authorization"] == "Bearer k-123"


def test_bad_options_are_clear():
    with pytest.raises(ConfigError, match="unknown reward_kwargs option.*valid options are"):
        VLLMRewardClient("http://127.0.0.1:1", retries=3)
    with pytest.raises(ConfigError, match="max_retries must be an integer"):
        VLLMRewardClient("http://127.0.0.1:1", max_retries="3")
    with pytest.raises(TypeError, match="all strings or all token-id lists"):
        client = VLLMRewardClient("http://127.0.0.1:1")
        run(client, client.score_batch(["a", [1]]))
