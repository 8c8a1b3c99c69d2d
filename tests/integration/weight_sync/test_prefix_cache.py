"""A weight update resets vLLM's prefix cache, read directly from the server's own counters.

vLLM's ``/metrics`` counts, per request, the prompt tokens looked up in the prefix cache
(``vllm:prefix_cache_queries_total``) and those found there (``vllm:prefix_cache_hits_total``).
Re-scoring the same inputs hits the cache; right after a publish the same inputs must find
nothing (cached blocks computed with the old weights would give stale scores), and the scores
must be the new model's.
"""

from __future__ import annotations

import re
import time

import requests
from sync_helpers import assert_parity, load_rm, perturbed, reset_server, server_scores

from verl_vllm_rm.weight_sync import RewardModelPublisher

# Two inputs of a few KV-cache blocks each (vLLM-CPU's block is 128 tokens): cacheable prefixes.
INPUTS = [[5 + (i * 7) % 300 for i in range(300)], [11 + (i * 13) % 400 for i in range(260)]]


def prefix_cache_counters(url: str) -> tuple[float, float]:
    """(tokens queried, tokens hit) since the server started."""
    text = requests.get(f"{url}/metrics", timeout=10).text

    def counter(name: str) -> float:
        return float(re.search(rf"^vllm:{name}_total\{{[^}}]*\}} (\S+)$", text, re.M).group(1))

    return counter("prefix_cache_queries"), counter("prefix_cache_hits")


def hits_when_scoring(url: str, inputs: list[list[int]]) -> tuple[list[float], float]:
    """Score ``inputs`` and return the scores and the prefix-cache hits they had (waits until the server
    has counted this request's lookups: every input token is queried once)."""
    queried, hit = prefix_cache_counters(url)
    scores = server_scores(url, inputs)
    expected = queried + sum(map(len, inputs))
    deadline = time.monotonic() + 30
    while (now := prefix_cache_counters(url))[0] < expected:
        assert time.monotonic() < deadline, f"the server never counted the request's lookups: {now}"
        time.sleep(0.05)
    assert now[0] == expected, now
    return scores, now[1] - hit


def test_publish_resets_the_prefix_cache(ws_server, tiny_rm):
    url = ws_server.url
    reset_server(url, tiny_rm)
    hits_when_scoring(url, INPUTS)
    before, hits = hits_when_scoring(url, INPUTS)
    assert hits > 0, "the same inputs again must hit the prefix cache, or this test could not see a reset"

    model = perturbed(load_rm(tiny_rm), seed=11)
    with RewardModelPublisher(url, timeout_s=60) as pub:
        pub.publish(model, pub.version + 1, "full")
    after, hits = hits_when_scoring(url, INPUTS)
    assert hits == 0, f"{hits:.0f} tokens came from the cache filled with the old weights"
    assert after != before
    assert_parity(url, model, INPUTS)  # not stale: the new weights' scores

    _, hits = hits_when_scoring(url, INPUTS)
    assert hits > 0, "the cache works again after the update"
