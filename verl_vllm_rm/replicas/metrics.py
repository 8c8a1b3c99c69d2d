"""Per-replica metrics of one training step, from two readings of a fleet's status (pure)."""

from __future__ import annotations

from typing import Any, Sequence


def replica_step_metrics(rm_name: str, now: Sequence[dict[str, Any]],
                         before: Sequence[dict[str, Any]] | None = None) -> dict[str, float]:
    """``replicas/<rm>/<i>/{requests,inputs,failures,latency_ms,version,routed,restarts}`` over the step between
    ``before`` and ``now`` (:meth:`ReplicaFleet.replica_status` readings; ``before`` None: since the start).

    A server's counters restart with its process: a replica restarted in between counts from zero.
    """
    out: dict[str, float] = {}
    for i, st in enumerate(now):
        prev = before[i] if before is not None and before[i]["restarts"] == st["restarts"] else None
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
        out[f"{prefix}/restarts"] = float(st["restarts"])
    return out
