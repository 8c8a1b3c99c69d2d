"""A fixed list of two real servers, one frozen (SIGSTOP: alive, port open, never answering) during a publish.

By default (``online_rm.on_server_failure`` unset: ``abort``) the version fails everywhere and both servers keep
serving the old one. With ``leave_behind`` the publish goes ahead on the live server; a client over the list sends
every request to the server on the newest version, none to the frozen one, nor to it once thawed and behind; the
next publish re-syncs it, and it serves again, exactly the published weights. The frozen server is the session's
fault server, whose ``--weight-update-stall-timeout`` (``FAULT_SERVER_STALL_S``) drops the update it was
receiving once it is thawed.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import requests
from process_helpers import wait_until
from sync_helpers import load_rm, perturbed, reset_server, runtime_version

from verl_vllm_rm.client.reward_client import VLLMRewardClient
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.weight_sync import MultiServerPublisher, WeightSyncError

pytestmark = pytest.mark.server

#: the client fails over from an unanswered request after 1 s + a 1 s /health, and asks a server behind for its
#: version again every 0.5 s
CLIENT = dict(failover_after_s=1.0, health_timeout_s=1.0, endpoint_cooldown_s=0.5, max_retries=3,
              backoff_base_s=0.01, backoff_max_s=0.05)
PUBLISH_TIMEOUT_S = 20.0  # each weight-sync call to the frozen server gives up after this long (a join of the live
# one on a loaded machine took over 8 s)


def requests_served(url: str) -> int:
    return requests.get(f"{url}/health", timeout=10).json()["scoring"]["requests"]


def score_rounds(client: VLLMRewardClient, ids: list[list[int]], rounds: int) -> list:
    """``rounds`` rounds of one request per probe sequence, concurrently: each request's scores (their version)."""
    async def go():
        answers = []
        for _ in range(rounds):
            answers += await asyncio.gather(*(client.score_request([x]) for x in ids))
        await client.close()
        return answers

    return asyncio.run(go())


def test_a_frozen_server_aborts_the_version_or_is_left_behind_and_resynced(ws_server, fault_server, tiny_rm,
                                                                          probe_ids):
    live, frozen = ws_server.url, fault_server.url
    first, second, third = (perturbed(load_rm(tiny_rm), seed) for seed in (11, 12, 13))
    client = VLLMRewardClient([live, frozen], **CLIENT)
    stopped = False
    try:
        # abort (the default): the version fails on both, naming the frozen server; both serve the old one
        with MultiServerPublisher([live, frozen], timeout_s=PUBLISH_TIMEOUT_S) as aborting:
            old = runtime_version(live)
            os.killpg(fault_server.process.pid, signal.SIGSTOP)
            stopped = True
            with pytest.raises(WeightSyncError, match=rf"version {aborting.version + 1} failed on 1 server\(s\) "
                                                      rf"\({frozen}: .*none of the servers applied it; they all serve "
                                                      "the old version"):
                aborting.publish(first, aborting.version + 1, "full")
            assert runtime_version(live) == old
        os.killpg(fault_server.process.pid, signal.SIGCONT)
        stopped = False
        wait_until(lambda: requests.get(f"{frozen}/health", timeout=5).ok, timeout_s=60, what="the thawed server")

        with MultiServerPublisher([live, frozen], leave_behind=True, timeout_s=PUBLISH_TIMEOUT_S) as pub:
            v1 = pub.version + 1
            pub.publish(first, v1, "full")
            assert (runtime_version(live), runtime_version(frozen), pub.left_behind) == (v1, v1, [])
            before = requests_served(frozen)
            assert {s.version for s in score_rounds(client, probe_ids, 2)} == {v1}
            assert requests_served(frozen) > before  # both servers take requests

            os.killpg(fault_server.process.pid, signal.SIGSTOP)
            stopped = True
            # leave_behind: the live server takes v2, the frozen one is left behind
            v2 = v1 + 1
            results = pub.publish(second, v2, "full")
            assert len(results) == 1 and pub.left_behind == [frozen] and set(pub.publishers) == {live}
            assert runtime_version(live) == v2
            expected = sequence_scores(second, probe_ids)
            answers = score_rounds(client, probe_ids, 2)
            assert {s.version for s in answers} == {v2}  # a request that met the frozen server failed over
            assert max(abs(s[0] - expected[i % len(probe_ids)]) for i, s in enumerate(answers)) < 1e-4

            os.killpg(fault_server.process.pid, signal.SIGCONT)
            stopped = False
            wait_until(lambda: requests.get(f"{frozen}/health", timeout=5).ok, timeout_s=60, what="the thawed server")
            # and the client's cooldown of it over (its last failover was moments ago): from here on, only its
            # version keeps it out of routing
            wait_until(lambda: client.endpoint_stats()[frozen]["cooldown_left_s"] == 0.0, timeout_s=60,
                       what="the client's cooldown of the thawed server")
            assert runtime_version(frozen) == v1  # thawed, behind
            # none scored by it: its answers would carry v1 (its /health counter also counts the requests it took
            # while frozen, which it answers once thawed, to clients that failed over long before)
            answers = score_rounds(client, probe_ids, 3)
            assert {s.version for s in answers} == {v2}
            before = requests_served(frozen)

            v3 = v2 + 1  # the next publish re-syncs it (a fresh session, once its broken one was dropped)
            results = pub.publish(third, v3, "full")
            assert len(results) == 2 and pub.left_behind == [] and set(pub.publishers) == {live, frozen}
            expected = sequence_scores(third, probe_ids)
            answers = score_rounds(client, probe_ids, 3)
            assert {s.version for s in answers} == {v3}
            assert max(abs(s[0] - expected[i % len(probe_ids)]) for i, s in enumerate(answers)) < 1e-4
            assert requests_served(frozen) > before  # back in routing
    finally:
        if stopped:
            os.killpg(fault_server.process.pid, signal.SIGCONT)
        wait_until(lambda: requests.get(f"{frozen}/health", timeout=5).ok, timeout_s=120, what="the fault server")
        for url in (live, frozen):
            reset_server(url, tiny_rm)
