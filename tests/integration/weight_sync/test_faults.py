"""Failures during updates: a trainer that dies mid-transfer, and scoring concurrent with updates."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests
import torch
from sync_helpers import (PARITY_ATOL, UnreadableTensor, assert_parity, load_rm, max_diff, perturbed, reset_server,
                          runtime_version, server_scores, unreadable, wait_for_failed_update)

from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.weight_sync import RewardModelPublisher, WeightSyncError
from repo_paths import SUPPORT

KILLED_TRAINER = SUPPORT / "killed_trainer.py"
TRANSFER_TIMEOUT_S = 20
LIVENESS_DEADLINE_S = 300  # a hang guard for the subprocess and threads, not a speed requirement


def test_trainer_killed_mid_transfer_leaves_old_weights_serving(ws_server, tiny_rm, probe_ids):
    old_version = reset_server(ws_server.url, tiny_rm)
    old_model = load_rm(tiny_rm)
    proc = subprocess.run(
        [sys.executable, str(KILLED_TRAINER), "bucket:3", ws_server.url, tiny_rm, str(old_version + 1),
         str(TRANSFER_TIMEOUT_S)],
        capture_output=True, text=True, timeout=LIVENESS_DEADLINE_S,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr

    health = wait_for_failed_update(ws_server.url, old_version + 1)
    assert health["status"] == "ok"
    assert health["last_failed_update"]["status"] == "failed"
    assert health["last_failed_update"]["serving_version"] == old_version
    assert health["last_failed_update"]["error"]
    assert runtime_version(ws_server.url) == old_version
    assert_parity(ws_server.url, old_model, probe_ids)  # the old weights, untouched by the partial transfer

    # The server recovers: a new trainer connects and publishes.
    new_model = load_rm(tiny_rm)
    with torch.no_grad():
        new_model.score.weight.mul_(-1.0)
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:
        pub.publish(new_model, old_version + 1, "head_only")
    assert runtime_version(ws_server.url) == old_version + 1
    assert_parity(ws_server.url, new_model, probe_ids)


def test_a_server_that_never_joins_fails_the_publish_with_weight_sync_error(ws_server, tiny_rm, probe_ids):
    """The trainer asks the server to join its group at an address the server cannot reach (TEST-NET-2, RFC 5737,
    routed nowhere): the server never joins, and the publish raises WeightSyncError naming the address, within the
    publisher's timeout; the old weights keep serving and a publisher at the right address goes ahead."""
    old_version = reset_server(ws_server.url, tiny_rm)
    old_model = load_rm(tiny_rm)
    with RewardModelPublisher(ws_server.url, timeout_s=5, master_address="198.51.100.1") as pub:
        with pytest.raises(WeightSyncError, match=r"the server did not join this trainer's transfer group at "
                                                  r"198\.51\.100\.1:\d+: could not join .*is that address reachable"):
            pub.publish(perturbed(old_model, 1), old_version + 1, "full")
        assert not pub.connected
    assert runtime_version(ws_server.url) == old_version
    assert_parity(ws_server.url, old_model, probe_ids)
    assert reset_server(ws_server.url, tiny_rm) == old_version + 1


def test_concurrent_scoring_sees_old_or_new_weights_never_a_mix(ws_server, tiny_rm, probe_ids):
    reset_server(ws_server.url, tiny_rm)
    base = load_rm(tiny_rm)
    states = [base] + [perturbed(base, seed) for seed in range(1, 5)]
    expected = [sequence_scores(m, probe_ids) for m in states]
    responses: list[tuple[int, list[float]]] = []  # (scoring thread, scores) in the order they came back
    errors: list[str] = []
    counts = [0] * 4
    stop = threading.Event()

    def score_forever(i: int) -> None:
        while not stop.is_set():
            resp = requests.post(f"{ws_server.url}/score", json={"input": probe_ids}, timeout=120)
            if resp.status_code != 200:
                errors.append(resp.text)
            else:
                responses.append((i, [d["score"] for d in resp.json()["data"]]))
            counts[i] += 1

    def wait_for_one_more_round() -> None:
        seen = list(counts)
        while any(c <= s for c, s in zip(counts, seen)):
            time.sleep(0.01)

    threads = [threading.Thread(target=score_forever, args=(i,), daemon=True) for i in range(len(counts))]
    for t in threads:
        t.start()
    wait_for_one_more_round()
    with RewardModelPublisher(ws_server.url, timeout_s=60, bucket_bytes=128 << 10) as pub:
        for model in states[1:]:
            pub.publish(model, pub.version + 1, "full")
    # a request in flight during the last commit may come back first: the round after it started after the publish
    wait_for_one_more_round()
    wait_for_one_more_round()
    stop.set()
    for t in threads:
        t.join(timeout=LIVENESS_DEADLINE_S)

    assert not errors, errors[:3]
    matched: dict[int, list[int]] = {}
    for i, scores in responses:
        candidates = [k for k, ref in enumerate(expected) if max_diff(scores, ref) <= PARITY_ATOL]
        assert candidates, f"scores match no single weight version (a mixed update?): {scores}"
        matched.setdefault(i, []).append(candidates[0])
    for versions in matched.values():  # each thread: the old weights first, the newest last
        assert versions[0] == 0 and versions[-1] == len(states) - 1, versions
    assert_parity(ws_server.url, states[-1], probe_ids)


def test_a_stalled_trainer_does_not_stall_scoring(ws_server, tiny_rm, probe_ids):
    """The buckets arrive in the background: scoring goes on with the old weights until the
    transfer is complete, and a trainer that never sends only fails its own update."""
    old_version = reset_server(ws_server.url, tiny_rm)
    old_model = load_rm(tiny_rm)
    pub = RewardModelPublisher(ws_server.url, timeout_s=5)
    pub.connect()  # both sides join the group; then the trainer announces an update and stalls
    body = {"metadata": [{"name": "score.weight", "dtype": "float32", "shape": [1, 128]}],
            "training_mode": "head_only", "version": old_version + 1, "bucket_bytes": 1 << 20}
    with requests.post(f"{ws_server.url}/update_param_batch", json=body, stream=True, timeout=60) as update:
        lines = (line for line in update.iter_lines() if line)
        assert b'"accepted"' in next(lines)
        assert_parity(ws_server.url, old_model, probe_ids)
        health = requests.get(f"{ws_server.url}/health", timeout=10).json()
        assert health["pending_update"] == old_version + 1  # scored while the update still waits for tensors
        assert runtime_version(ws_server.url) == old_version
        final = next(lines)  # the group's timeout ends the stalled receive
    assert b'"failed"' in final and b"receiving the weights failed: " in final, final
    pub.session.drop()  # the server closed the session; the next publish joins a new one
    health = wait_for_failed_update(ws_server.url, old_version + 1)
    assert health["last_failed_update"]["serving_version"] == old_version
    assert reset_server(ws_server.url, tiny_rm) == old_version + 1  # a fresh publish works again


def test_a_transfer_that_breaks_on_the_trainer_fails_the_publish_and_the_server_keeps_its_weights(ws_server, tiny_rm,
                                                                                               probe_ids):
    """A head whose data cannot be read on the trainer (a fault injected at the read that packs it) passes every
    metadata check, and packing its first bucket fails after the server accepted the update: the publish raises
    WeightSyncError naming the version and the cause, the server's receive fails in turn, and the weights it
    served before keep serving, under their version. (A head on torch's meta device is refused before anything
    is sent: test_refusals.)"""
    version, before = runtime_version(ws_server.url), server_scores(ws_server.url, probe_ids)
    with RewardModelPublisher(ws_server.url, timeout_s=TRANSFER_TIMEOUT_S) as pub:
        with pytest.raises(WeightSyncError, match=rf"^weight transfer for version {version + 1} failed: "
                                                  f"{UnreadableTensor.MESSAGE}"):
            pub.publish({"score.weight": unreadable((1, 128))}, version + 1, "head_only")
        assert not pub.connected  # dropped: the server closes its side after a failed update
    health = wait_for_failed_update(ws_server.url, version + 1)
    assert health["last_failed_update"]["serving_version"] == version
    assert runtime_version(ws_server.url) == version
    assert max_diff(server_scores(ws_server.url, probe_ids), before) <= 1e-5


def test_a_server_that_could_not_apply_fails_the_publish(ws_server, tiny_rm):
    """The server's final answer reports a failed reload: the publish raises WeightSyncError with the server's
    own error and drops its communicator. No real server fails a reload on demand (it takes an engine fault), so
    the fault is injected into the real answer by a proxy: the update's final line (after the real server received
    and applied it) is replaced by the record such a failure gives."""
    from fault_proxy import FaultProxy, Faults

    version = reset_server(ws_server.url, tiny_rm)
    failure = {"version": version + 1, "status": "failed", "serving_version": version,
               "error": "RuntimeError: the reload ran out of memory"}
    final_fails = {"/update_param_batch": lambda line: line if line.get("status") == "accepted" else failure}
    with FaultProxy(ws_server.url, Faults(rewrite_lines=final_fails)) as proxy:
        with RewardModelPublisher(proxy.url, timeout_s=60) as pub:
            with pytest.raises(WeightSyncError, match=rf"^the server could not apply version {version + 1}: "
                                                      r"RuntimeError: the reload ran out of memory$"):
                pub.publish(load_rm(tiny_rm), version + 1, "head_only")
            assert not pub.connected and pub.version == version
    real = [json.loads(line) for r in proxy.requests if r["path"] == "/update_param_batch"
            for line in r["answer"].splitlines()]
    assert real[0]["status"] == "accepted" and real[-1]["status"] == "ok"  # the real server applied it
    assert reset_server(ws_server.url, tiny_rm) == version + 2  # a fresh session publishes again
