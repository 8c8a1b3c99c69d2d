"""Per-replica step metrics from two fleet status readings (``replicas/metrics.py``)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.replicas.metrics import replica_step_metrics


def status(requests, inputs, busy_s, *, restarts=0, routed=True, version=0, refused=0, failed=0, healthy=True,
           evictions=0, resyncs=0, given_up=False):
    return {"routed": routed, "version": version, "restarts": restarts, "healthy": healthy, "given_up": given_up,
            "evictions": evictions, "resyncs": resyncs,
            "scoring": {"requests": requests, "inputs": inputs, "busy_s": busy_s, "refused": refused,
                        "failed": failed}}


def test_step_metrics_are_the_counters_moves_since_the_last_reading():
    before = [status(10, 80, 1.0), status(4, 30, 0.5, refused=1)]
    now = [status(14, 112, 1.4), status(4, 30, 0.5, refused=2, failed=1)]
    m = replica_step_metrics("safety", now, before)
    assert m["replicas/safety/0/requests"] == 4 and m["replicas/safety/0/inputs"] == 32
    assert m["replicas/safety/0/latency_ms"] == pytest.approx(100.0)  # 0.4 s over 4 requests
    assert m["replicas/safety/1/requests"] == 0 and m["replicas/safety/1/latency_ms"] == 0.0
    assert m["replicas/safety/1/failures"] == 2  # one more refused, one failed
    assert m["replicas/safety/0/routed"] == 1.0 and m["replicas/safety/0/version"] == 0.0


def test_a_restarted_replica_counts_from_zero_and_a_down_one_is_out_of_routing():
    before = [status(50, 400, 5.0)]
    now = [status(3, 24, 0.3, restarts=1)]  # a new server process: its counters restarted
    m = replica_step_metrics("rm", now, before)
    assert m["replicas/rm/0/requests"] == 3 and m["replicas/rm/0/restarts"] == 1.0
    down = replica_step_metrics("rm", [status(0, 0, 0.0, routed=False, version=None)])
    assert down["replicas/rm/0/routed"] == 0.0 and down["replicas/rm/0/version"] == -1.0


def test_the_fleet_counts_healthy_replicas_and_the_steps_evictions_resyncs_and_restarts():
    """A replica that hung (evicted, restarted) and one left behind by a publish and re-synced: per replica and for
    the fleet, the step's moves of the fleet's counters (they survive a restart) and who is healthy now."""
    before = [status(5, 40, 0.5, evictions=1), status(5, 40, 0.5, resyncs=2)]
    now = [status(0, 0, 0.0, restarts=1, healthy=False, routed=False, evictions=2),
           status(9, 72, 0.9, evictions=1, resyncs=3)]
    m = replica_step_metrics("rm", now, before)
    assert (m["replicas/rm/0/evictions"], m["replicas/rm/0/resyncs"], m["replicas/rm/0/healthy"]) == (1.0, 0.0, 0.0)
    assert (m["replicas/rm/1/evictions"], m["replicas/rm/1/resyncs"], m["replicas/rm/1/healthy"]) == (1.0, 1.0, 1.0)
    assert {k: m[f"replicas/rm/{k}"] for k in ("healthy", "routed", "evictions", "resyncs", "restarts")} == {
        "healthy": 1.0, "routed": 1.0, "evictions": 2.0, "resyncs": 1.0, "restarts": 1.0}
    gone = replica_step_metrics("rm", [status(0, 0, 0.0, healthy=False, routed=False, given_up=True)])
    assert gone["replicas/rm/0/given_up"] == 1.0 and gone["replicas/rm/healthy"] == 0.0
