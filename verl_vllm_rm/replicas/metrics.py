"""Per-replica metrics of one training step, from two readings of a fleet's status (pure)."""

from __future__ import annotations

from typing import Any, Sequence


def replica_step_metrics(rm_name: str, now: Sequence[dict[str, Any]],
                         before: Sequence[dict[str, Any]] | None = None) -> dict[str, float]:
    """``replicas/<rm>/<i>/{requests,inputs,failures,latency_ms,version,routed,healthy,given_up,restarts}`` and the
    step's ``evictions`` and ``resyncs`` per replica, and for the fleet ``replicas/<rm>/{healthy,routed}`` (now) and
    ``replicas/<rm>/{evictions,resyncs,restarts}`` (this step), between ``before`` and ``now``
    (:meth:`ReplicaFleet.replica_status` readings; ``before`` None: since the start).

    A server's counters restart with its process: a replica restarted in between counts from zero.
    """
    out: dict[str, float] = {}
    fleet = {"healthy": 0.0, "routed": 0.0, "evictions": 0.0, "resyncs": 0.0, "restarts": 0.0}
    for i, st in enumerate(now):
        last = before[i] if before is not None else None
        prev = last if last is not None and last["restarts"] == st["restarts"] else None
        cur, old = st["scoring"], (prev or {}).get("scoring", {})

        def delta(key: str) -> float:
            return float(cur.get(key, 0)) - float(old.get(key, 0))

        requests = delta("requests")
        prefix = f"replicas/{rm_name}/{i}"
        out[f"{prefix}/requests"] = requests
        out[f"{prefix}/inputs"] = delta("inputs")
        out[f"{prefix}/failures"] = delta("refused") + delta("failed")
        out[f"{prefix}/latency_ms"] = 1000.0 * delta("busy_s") / requests if requests > 0 else 0.0
        out[f"{prefix}/version"] = float(st["version"]) if st["version"] is not None else -1.0
        out[f"{prefix}/routed"] = float(st["routed"])
        out[f"{prefix}/healthy"] = float(st["healthy"])
        out[f"{prefix}/given_up"] = float(st["given_up"])
        out[f"{prefix}/restarts"] = float(st["restarts"])
        for key in ("evictions", "resyncs"):  # the fleet's own counters: they survive a restart
            out[f"{prefix}/{key}"] = float(st[key] - (last[key] if last is not None else 0))
        fleet["healthy"] += st["healthy"]
        fleet["routed"] += st["routed"]
        fleet["evictions"] += out[f"{prefix}/evictions"]
        fleet["resyncs"] += out[f"{prefix}/resyncs"]
        fleet["restarts"] += st["restarts"] - (last["restarts"] if last is not None else 0)
    out.update({f"replicas/{rm_name}/{key}": value for key, value in fleet.items()})
    return out
