"""A fleet's bookkeeping of its replicas (``replicas/fleet.py``) with no Ray: each replica's status from its
``/health`` readings, what a failed start says, and how the failures and the fleet's actor are named (the fleet
itself on Ray: tests/integration/replicas/test_fleet.py)."""

from __future__ import annotations

from ray.exceptions import RayTaskError

from verl_vllm_rm.replicas.fleet import FleetReadings, ReplicaStatus, causes, fleet_name, start_error
from verl_vllm_rm.replicas.launcher import ServerStartError


def test_a_replica_status_counts_evictions_and_resyncs_but_not_a_commit_the_fleet_has_not_seen_yet():
    """Health readings of one replica against the fleet's version: a replica that committed a publish before the
    fleet moved to it is briefly out of routing without an eviction; a missed /health is one; a replica seen behind
    and later routed on the fleet's version was re-synced."""

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


def test_a_replica_up_without_a_version_is_healthy_but_not_routed_and_keeps_its_counters():
    st = ReplicaStatus(2, url="http://h:1")
    st.update({"status": "ok", "scoring": {"requests": 3, "busy_s": 0.5}}, 0)
    assert (st.healthy, st.routed, st.version, st.evictions) == (True, False, None, 0)
    assert st.scoring == {"requests": 3, "busy_s": 0.5}
    st.update({"status": "ok", "version": 0, "scoring": {"requests": 5}}, 0)
    assert (st.routed, st.scoring) == (True, {"requests": 5})
    st.update(None, 0)  # down: it keeps the last counters and version it reported
    assert (st.healthy, st.routed, st.version, st.scoring, st.evictions) == (False, False, 0, {"requests": 5}, 1)


def test_a_failed_start_says_the_launchers_error_without_rays_wrapping():
    launcher = ServerStartError("server exited with code 1; log tail:\nverl-vllm-rm: --model /x does not exist")
    wrapped = RayTaskError("ServerReplica.start", "Traceback (most recent call last): ...", launcher)
    assert start_error(wrapped) == ("ServerStartError: server exited with code 1; log tail:\n"
                                    "verl-vllm-rm: --model /x does not exist")
    assert start_error(TimeoutError("placement")) == "TimeoutError: placement"


def test_causes_name_each_replica_and_its_last_error_one_per_line():
    failed = [ReplicaStatus(0, last_error="ServerStartError: boom"), ReplicaStatus(3, last_error="drained: probe")]
    assert causes(failed) == "replica 0: ServerStartError: boom\nreplica 3: drained: probe"
    assert causes([]) == ""


def test_a_fleets_actor_is_named_after_its_rm_and_no_fleet_gives_no_metrics():
    assert fleet_name("safety") == "vllm_rm_replicas_safety"
    readings = FleetReadings({})  # no managed RM: nothing is started, no step metrics
    assert readings.fleets == {} and readings.step_metrics() == {}
