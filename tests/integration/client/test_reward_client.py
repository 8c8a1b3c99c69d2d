"""VLLMRewardClient against the real server, with faults injected by a loopback proxy."""

import asyncio
import json
import socket
import threading
import time

import pytest
from client_calls import FAST, run

from verl_vllm_rm.client.reward_client import RewardRequestError, RewardServerError, VLLMRewardClient
from verl_vllm_rm.parity.reference import sequence_scores


@pytest.fixture()
def blackhole():
    """A loopback URL whose TCP connect hangs: a listener with a full accept queue (backlog 0, one
    connection never accepted) makes Linux drop every further SYN, as a firewalled host does."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname(), timeout=5)
    probe = socket.socket()
    probe.settimeout(0.3)
    with pytest.raises(OSError):  # the queue is full: a connect does hang here
        probe.connect(listener.getsockname())
    probe.close()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    filler.close()
    listener.close()


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


def test_token_budget_splits_requests(fault_proxy, tokenizer, hf_model, texts):
    """A token budget of the longest input packs the 6 inputs greedily into exactly 5 requests, in order,
    each within the budget and none that could have taken the next input too; the scores are right."""
    ids = [tokenizer(t).input_ids for t in texts[:6]]
    budget = max(map(len, ids))
    client = VLLMRewardClient(fault_proxy.url, max_batch_tokens=budget)
    got = run(client, client.score_batch(ids))
    sent = [json.loads(r["body"])["input"] for r in fault_proxy.requests if r["path"] == "/score"]
    assert [x for chunk in sent for x in chunk] == ids
    assert len(sent) == 5, [[len(x) for x in chunk] for chunk in sent]
    assert all(sum(map(len, chunk)) <= budget for chunk in sent)
    assert all(sum(map(len, a)) + len(b[0]) > budget for a, b in zip(sent, sent[1:]))  # greedy: no room left
    assert max(abs(a - b) for a, b in zip(got, sequence_scores(hf_model, ids))) < 1e-4


def test_4xx_is_not_retried(fault_proxy):
    client = VLLMRewardClient(fault_proxy.url, max_retries=5, **FAST)
    with pytest.raises(RewardRequestError, match=r"POST \S+/score was refused with HTTP 400.*longer than max_model"):
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


@pytest.mark.parametrize("kind, cause", [
    ("nan", r"non-finite or non-numeric score nan for input 0"),
    ("count", r"/score returned 2 scores for 3 inputs"),
    ("nonjson", r"response is not JSON"),
    ("index", r"/score returned a bad or repeated index 2"),
    ("truncated", r"ClientPayloadError"),
])
def test_corrupt_responses_are_errors_not_numbers(fault_proxy, texts, kind, cause):
    """Each corruption is retried once, then reported with its own cause (not any RewardServerError)."""
    fault_proxy.faults.corrupt = kind
    client = VLLMRewardClient(fault_proxy.url, max_retries=1, **FAST)
    with pytest.raises(RewardServerError, match=r"after 2 attempt\(s\).*" + cause):
        run(client, client.score_batch(texts[:3]))
    assert len(fault_proxy.requests) == 2


def test_read_timeout_is_honoured(fault_proxy, texts):
    fault_proxy.faults.delay_s = 5.0
    client = VLLMRewardClient(fault_proxy.url, read_timeout_s=0.3, max_retries=1, **FAST)
    with pytest.raises(RewardServerError, match="timed out"):
        run(client, client.score_batch(texts[:1]))


def test_deadline_bounds_the_whole_call(fault_proxy, texts):
    """The server holds the request until the client has returned, and every other limit is an hour: only the
    1 s deadline can end the call (without it the call would wait out the test's own timeout). One attempt, cut on
    its total, which the deadline set."""
    released = threading.Event()

    async def until_the_client_returned(record: dict) -> None:
        while not released.is_set():
            await asyncio.sleep(0.05)

    fault_proxy.faults.hold = until_the_client_returned
    client = VLLMRewardClient(fault_proxy.url, deadline_s=1.0, max_retries=50, request_timeout_s=3600,
                              read_timeout_s=3600, failover_after_s=3600, **FAST)
    try:
        # the attempt's total is what was left of the deadline when it started (1 s, or a hair under)
        with pytest.raises(RewardServerError, match=r"failed after 1 attempt\(s\), deadline_s 1 s ran out.*timed out "
                                                    r"on the attempt's total \(limits: total (1|0\.9\d*)s"):
            run(client, client.score_batch(texts[:1]))
    finally:
        released.set()
    assert [r["path"] for r in fault_proxy.requests] == ["/score"]


def test_dropped_connection_is_retried_then_reported(fault_proxy, texts):
    fault_proxy.faults.drop = True
    client = VLLMRewardClient(fault_proxy.url, max_retries=2, **FAST)
    with pytest.raises(RewardServerError, match="attempt"):
        run(client, client.score_batch(texts[:1]))
    assert len(fault_proxy.requests) == 3


@pytest.mark.parametrize("failing", ["dead", "slow"])
def test_failover_to_a_live_server(failing, dead_url, fault_proxy, rm_server, tokenizer, hf_model, texts, attempts):
    """A retry goes to another server: a dead one refuses at once, a slow one outlives read_timeout.

    Least-outstanding routing sends exactly half of each round's 8 concurrent one-sequence requests to the
    bad server first; a dead server is then avoided for endpoint_cooldown_s (5 s) and gets none of round
    2, a slow one is not marked down (it answers, late) and gets its half again."""
    fault_proxy.faults.delay_s = 5.0  # unused by the dead case
    bad = dead_url if failing == "dead" else fault_proxy.url
    # one retry only, one sequence per request: every request that met the bad server must fail over
    read_timeout_s = 1.5 if failing == "slow" else 30.0  # the live server's answers must fit in it too
    client = VLLMRewardClient([bad, rm_server.url], max_retries=1, read_timeout_s=read_timeout_s, max_batch_seqs=1,
                              **FAST)
    ids = [tokenizer(t).input_ids for t in texts[:8]]
    expected = sequence_scores(hf_model, ids)
    tried_bad = []
    for _ in range(2):
        attempts.clear()
        got = run(client, client.score_batch(ids))
        assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-4
        tried_bad.append(sum(url.startswith(bad + "/") for url in attempts))
        assert len(attempts) == 8 + tried_bad[-1]  # each request that met the bad server was retried once
    assert tried_bad == ([4, 0] if failing == "dead" else [4, 4])
    if failing == "slow":
        assert len(fault_proxy.requests) == 8


def test_least_outstanding_routing_spreads_load(rm_server, texts):
    """Each request goes to the server with the fewest requests in flight (ties at random).

    Equal servers: 8 concurrent requests split exactly 4/4 (a random router does so 27% of the time).
    A slow and a fast server, two requests at a time: the slow one holds its first request for 3 s
    while the fast one takes the other 7 one after another (a random router: 1 in 128)."""
    from fault_proxy import FaultProxy

    with FaultProxy(rm_server.url) as a, FaultProxy(rm_server.url) as b:
        a.faults.delay_s = b.faults.delay_s = 0.2
        client = VLLMRewardClient([a.url, b.url], max_batch_seqs=1)
        run(client, client.score_batch(texts[:8]))
        assert (len(a.requests), len(b.requests)) == (4, 4)

        a.requests.clear(), b.requests.clear()
        a.faults.delay_s, b.faults.delay_s = 3.0, 0.0
        client = VLLMRewardClient([a.url, b.url], max_batch_seqs=1, max_concurrent_requests=2)
        run(client, client.score_batch(texts[:8]))
        assert (len(a.requests), len(b.requests)) == (1, 7)


def test_model_name_is_sent_and_checked(fault_proxy, rm_server, tiny_rm, texts):
    """``model`` goes out in the request: the served name scores, another one is the server's 404 naming
    it, raised at once (a refusal, not retried)."""
    client = VLLMRewardClient(fault_proxy.url, model=tiny_rm, max_retries=3, **FAST)
    assert len(run(client, client.score_batch(texts[:2]))) == 2
    assert json.loads(fault_proxy.requests[0]["body"])["model"] == tiny_rm
    fault_proxy.requests.clear()
    client = VLLMRewardClient(fault_proxy.url, model="other-rm", max_retries=3, **FAST)
    with pytest.raises(RewardRequestError, match=r"HTTP 404: model 'other-rm' is not served here"):
        run(client, client.score_batch(texts[:2]))
    assert len(fault_proxy.requests) == 1


def test_connect_timeout_is_honoured(blackhole, rm_server, tokenizer, hf_model, texts):
    """``connect_timeout_s`` ends an attempt whose TCP connect hangs, well before the total and read
    timeouts (60 s here), and the retry fails over to the live server."""
    client = VLLMRewardClient(blackhole, connect_timeout_s=0.5, read_timeout_s=3600, request_timeout_s=3600,
                              deadline_s=3600, max_retries=0)
    with pytest.raises(RewardServerError, match=r"timed out connecting \(limits: total 3\.6e\+03s, connect 0\.5s"):
        run(client, client.score_batch(texts[:1]))

    ids = [tokenizer(t).input_ids for t in texts[:4]]
    client = VLLMRewardClient([blackhole, rm_server.url], connect_timeout_s=0.5, read_timeout_s=3600,
                              request_timeout_s=3600, deadline_s=3600, max_retries=1, max_batch_seqs=1, **FAST)
    got = run(client, client.score_batch(ids))
    assert max(abs(a - b) for a, b in zip(got, sequence_scores(hf_model, ids))) < 1e-4
    stats = client.endpoint_stats()
    assert stats[blackhole]["failures"] >= 1 and stats[blackhole]["failovers"] == stats[blackhole]["failures"]


def test_request_timeout_bounds_each_attempt(fault_proxy, texts):
    """``request_timeout_s`` is the total time of one attempt: a server that never answers is cut at 0.5 s each
    time although the read timeout is an hour (and no fail-over check comes first), and every attempt gets its own
    0.5 s: three attempts, each timed out on the total."""
    fault_proxy.faults.hang = True
    client = VLLMRewardClient(fault_proxy.url, request_timeout_s=0.5, read_timeout_s=3600, failover_after_s=3600,
                              max_retries=2, **FAST)
    with pytest.raises(RewardServerError, match=r"after 3 attempt\(s\).*timed out on the attempt's total \(limits: "
                                                r"total 0\.5s"):
        run(client, client.score_batch(texts[:1]))
    assert [r["path"] for r in fault_proxy.requests] == ["/score"] * 3


@pytest.fixture()
def hung_and_live(rm_server):
    """Two proxies in front of the session server: ``hung`` never answers (a stopped server), ``live`` forwards."""
    from fault_proxy import FaultProxy, Faults

    with FaultProxy(rm_server.url, Faults(hang=True)) as hung, FaultProxy(rm_server.url) as live:
        yield hung, live


def test_a_hung_server_fails_over_once_its_health_check_times_out(hung_and_live, tokenizer, hf_model, texts):
    """Requests that meet a hung server (it accepts, never answers, /health included) are moved to the live one
    once ``failover_after_s`` passed and ``/health`` did not answer within ``health_timeout_s``: every score is
    right, although the read and total timeouts are an hour (so only the fail-over can have ended those attempts).
    The hung server is then out of routing: a second batch meets its /health check at most, never a /score."""
    hung, live = hung_and_live
    ids = [tokenizer(t).input_ids for t in texts[:8]]
    client = VLLMRewardClient([hung.url, live.url], failover_after_s=0.5, health_timeout_s=0.5, read_timeout_s=3600,
                              request_timeout_s=3600, endpoint_cooldown_s=3600, max_batch_seqs=1, max_retries=2,
                              **FAST)

    async def two_batches():
        first = await asyncio.gather(*(client.score_request([x]) for x in ids))
        hung.requests.clear()
        second = await client.score_batch(ids)
        return first, second

    first, second = run(client, two_batches())
    expected = sequence_scores(hf_model, ids)
    assert max(abs(s[0] - e) for s, e in zip(first, expected)) < 1e-4
    assert max(abs(a - b) for a, b in zip(second, expected)) < 1e-4
    stats = client.endpoint_stats()
    assert stats[hung.url]["hangs"] >= 1, stats  # least-outstanding routing sent some of 8 to each server
    assert stats[hung.url]["failovers"] == sum(s.failovers for s in first) >= 1
    assert stats[live.url]["hangs"] == stats[live.url]["failovers"] == 0
    assert 3000 < stats[hung.url]["cooldown_left_s"] <= 3600 and stats[live.url]["cooldown_left_s"] == 0.0
    assert [r["path"] for r in hung.requests if r["path"] != "/health"] == []


def test_a_request_that_meets_only_hung_servers_fails_naming_the_hang(hung_and_live, tokenizer, texts):
    """With the hung server alone, no score comes back as a number: the first attempt ends at ``failover_after_s``
    with its /health unanswered; a retry asks /health first (the server is marked hung) and ends there."""
    hung, _ = hung_and_live
    ids = [tokenizer(texts[0]).input_ids]
    for retries, last in ((0, r"no answer after 0.5s and /health did not answer within 0.5s \(hung\)$"),
                          (1, r"attempt\(s\), max_retries 1 used up .*: /health did not answer within 0.5s \(hung\)$")):
        client = VLLMRewardClient([hung.url], failover_after_s=0.5, health_timeout_s=0.5, read_timeout_s=3600,
                                  request_timeout_s=3600, endpoint_cooldown_s=0, max_retries=retries, **FAST)
        with pytest.raises(RewardServerError, match=last):
            run(client, client.score_request(ids))


def test_a_server_found_hung_is_asked_for_health_before_it_gets_another_request(hung_and_live, tokenizer, texts):
    """With no cooldown, a server found hung is picked again at once, but its /health is asked first: it still
    does not answer, so the request goes to the live server. 20 requests one after another over [hung, live]
    (both idle: the router picks at random, the hung one 1 in 2): /health probes reach the hung server, /score
    never does again."""
    hung, live = hung_and_live
    ids = [tokenizer(texts[0]).input_ids]
    client = VLLMRewardClient([hung.url, live.url], failover_after_s=0.5, health_timeout_s=0.5, read_timeout_s=3600,
                              request_timeout_s=3600, endpoint_cooldown_s=0, max_retries=3, **FAST)

    async def requests_one_by_one():
        while client.endpoint_stats().get(hung.url, {}).get("hangs", 0) == 0:  # until a request met it hanging
            await client.score_request(ids)
        hung.requests.clear()
        for _ in range(20):
            await client.score_request(ids)

    run(client, requests_one_by_one())
    paths = [r["path"] for r in hung.requests]
    assert "/health" in paths and "/score" not in paths, paths


def test_a_busy_server_that_answers_health_keeps_its_request(fault_proxy, tokenizer, hf_model, texts):
    """A /score answered after 2 s by a server whose /health answers at once is no hang: past failover_after_s
    (0.2 s) the client checks /health, finds it up and keeps waiting; one /score attempt, no fail-over."""
    fault_proxy.faults.delay_s, fault_proxy.faults.delay_path = 2.0, "/score"
    ids = [tokenizer(texts[0]).input_ids]
    client = VLLMRewardClient(fault_proxy.url, failover_after_s=0.2, health_timeout_s=5, max_retries=2, **FAST)
    scores = run(client, client.score_request(ids))
    assert abs(scores[0] - sequence_scores(hf_model, ids)[0]) < 1e-4 and scores.failovers == 0
    paths = [r["path"] for r in fault_proxy.requests]
    assert paths.count("/score") == 1 and paths.count("/health") >= 1, paths
    assert client.endpoint_stats()[fault_proxy.url]["hangs"] == 0


COOLDOWN_S = 6.0  # long enough for 5 calls to a loaded 2-core server to fall inside it


def test_endpoint_cooldown_keeps_a_refusing_server_out_of_rotation(dead_url, rm_server, texts, attempts):
    """A server that refused a connection gets no request for ``endpoint_cooldown_s``, then is tried again.

    20 calls one after another over [dead, live] (both idle, so the router picks at random): with a
    30 s cooldown the dead server is tried once; with 0 s it keeps being picked (<=1 in 20 by chance:
    2e-5). With COOLDOWN_S it is avoided until they are over, then tried again."""

    def calls(client, n):
        start = len(attempts)
        for _ in range(n):
            assert len(run(client, client.score_batch(texts[:1]))) == 1
        return sum(url.startswith(dead_url + "/") for url in attempts[start:])

    options = dict(max_retries=1, **FAST)
    assert calls(VLLMRewardClient([dead_url, rm_server.url], endpoint_cooldown_s=30, **options), 20) == 1
    assert calls(VLLMRewardClient([dead_url, rm_server.url], endpoint_cooldown_s=0, **options), 20) >= 2

    client = VLLMRewardClient([dead_url, rm_server.url], endpoint_cooldown_s=COOLDOWN_S, **options)
    for _ in range(60):  # until the random router has met the dead server once (1 in 2 per call)
        if calls(client, 1):
            break
    marked = time.monotonic()
    assert calls(client, 5) == 0, "avoided during the cooldown"
    assert time.monotonic() - marked < COOLDOWN_S, "the 5 calls must fall inside the cooldown for this to mean anything"
    time.sleep(max(0.0, marked + COOLDOWN_S + 0.1 - time.monotonic()))  # the cooldown itself, not a synchronisation
    assert any(calls(client, 1) for _ in range(60)), "tried again after the cooldown"


def test_api_key_header_and_model_version(fault_proxy):
    client = VLLMRewardClient(fault_proxy.url, api_key="k-123")
    assert run(client, client.get_model_version()) == 0
    assert fault_proxy.requests[0]["headers"]["Authorization"] == "Bearer k-123"


def test_a_followed_source_gives_the_servers_and_is_asked_again(rm_server, blackhole, tokenizer, hf_model, texts):
    """``follow``: requests wait for the source's first list (managed replicas come up behind it), route over
    it, and take a new list at most every ``refresh_s`` (a replica out of routing is dropped; every server's
    figures are kept)."""
    lists = [[blackhole], [rm_server.url]]
    asked = []

    async def source():
        asked.append(time.monotonic())
        await asyncio.sleep(0.2)  # the fleet answers once its replicas are up
        return lists[min(len(asked), 2) - 1]

    client = VLLMRewardClient(max_retries=6, connect_timeout_s=0.3, **FAST)
    client.follow(source, refresh_s=0.3)
    ids = [tokenizer(t).input_ids for t in texts[:2]]
    scores = run(client, client.score_batch(ids))  # first to the blackhole, then the refreshed list
    assert scores == pytest.approx(sequence_scores(hf_model, ids), abs=1e-4)
    assert len(asked) >= 2 and client.urls == [rm_server.url]
    assert client.endpoint_stats()[blackhole]["requests"] >= 1  # dropped from routing, its figures kept
    stats = client.endpoint_stats()[rm_server.url]
    assert stats["requests"] >= 1 and stats["failures"] == 0 and stats["latency_ms"] > 0
