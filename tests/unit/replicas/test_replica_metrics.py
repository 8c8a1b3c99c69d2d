"""Per-replica step metrics from two fleet status readings, and the replicas option block's refusals."""

from __future__ import annotations

import pytest

from verl_vllm_rm.replicas.metrics import replica_step_metrics
from verl_vllm_rm.scoring.options import parse_options


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


def test_a_replica_status_counts_evictions_and_resyncs_but_not_a_commit_the_fleet_has_not_seen_yet():
    """Health readings of one replica against the fleet's version: a replica that committed a publish before the
    fleet moved to it is briefly out of routing without an eviction; a missed /health is one; a replica seen behind
    and later routed on the fleet's version was re-synced."""
    from verl_vllm_rm.replicas.fleet import ReplicaStatus

    def ok(version):
        return {"status": "ok", "version": version}

    st = ReplicaStatus(0)
    st.update(ok(0), 0)
    assert (st.routed, st.evictions) == (True, 0)
    st.update(ok(1), 0)  # committed version 1; the fleet still says 0
    assert (st.routed, st.evictions) == (False, 0)
    st.update(ok(1), 1)
    assert (st.routed, st.resyncs) == (True, 0)
    st.update(None, 1)  # hung or down
    assert (st.routed, st.healthy, st.evictions) == (False, False, 1)
    st.update(ok(1), 2)  # back, but the fleet moved on without it
    assert (st.routed, st.lagging, st.evictions) == (False, True, 1)
    st.update(ok(3), 3)  # a publish re-synced it
    assert (st.routed, st.resyncs, st.lagging) == (True, 1, False)
    st.drained = True
    st.update(ok(3), 3)
    assert (st.routed, st.evictions) == (False, 2)


@pytest.mark.parametrize("kwargs, message", [
    ({"server_url": "http://a:1", "replicas": {"model": "/rm"}}, r"both server_url \['http://a:1'\] and replicas"),
    ({"replicas": {"model": "/rm", "num_replicas": 0}}, r"num_replicas must be >= 1"),
    ({"replicas": {"model": "/rm", "server_args": ["--port=9"]}}, r"server_args sets \['--port'\]"),
    ({"replicas": {"model": "/rm", "restart_backoff_s": 9, "max_restart_backoff_s": 2}}, r"max_restart_backoff_s"),
    ({"replicas": {"model": "/rm", "placement": "ANY"}}, r"placement='ANY' is not one of"),
    ({"replicas": {"num_replicas": 2}}, r"model"),
    ({"replicas": {"model": "/rm", "num_replicas": 2, "min_healthy": 3}},
     r"min_healthy=3 is more than replicas.num_replicas=2: lower it, or leave it unset"),
    ({"replicas": {"model": "/rm", "min_healthy": 0}}, r"min_healthy must be >= 1, got 0"),
    ({"replicas": {"model": "/rm", "max_failed_starts": 0}}, r"max_failed_starts must be >= 1, got 0"),
    ({"replicas": {"model": "/rm", "hung_restart_s": 0}}, r"hung_restart_s must be > 0, got 0"),
    ({"replicas": {"model": "/rm", "health_timeout_s": -1}}, r"health_timeout_s must be > 0, got -1"),
])
def test_replicas_options_refusals_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        parse_options(kwargs)


def test_each_rm_entry_has_its_own_servers_or_replicas():
    opts = parse_options({"server_url": "http://a:1", "reward_models": [
        {"name": "helpful"}, {"name": "safety", "replicas": {"model": "/rm", "num_replicas": 2}}]})
    helpful, safety = opts.rm_options
    assert helpful.client.server_url == ["http://a:1"] and helpful.replicas is None
    assert safety.replicas.num_replicas == 2  # the top level's server_url belongs to the other RM
    top = parse_options({"replicas": {"model": "/rm"}, "reward_models": [
        {"name": "a"}, {"name": "b", "server_url": "http://b:1"}]})
    a, b = top.rm_options
    assert a.replicas.model == "/rm" and b.replicas is None and b.client.server_url == ["http://b:1"]
