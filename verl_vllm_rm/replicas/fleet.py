"""Reward-server replicas managed on verl's Ray cluster: started once per run, found by name, supervised.

:func:`fleet_for` returns one RM's fleet: a named Ray actor (``vllm_rm_replicas_<rm>``) created
by whichever process asks first (Ray's ``get_if_exists``), so all of verl's reward-loop workers
share one. Trainer modes ``vllm_rm*`` ask first, at set-up (:class:`FleetReadings`); under another
trainer mode the first reward-loop worker to score does. The fleet reserves a placement group with
one bundle per replica (``{"CPU": cpus_per_replica, "GPU": gpus_per_replica}``), starts one
:class:`ServerReplica` actor in each bundle, and its constructor returns only when every replica
answers ``/health``; Ray holds every call to the fleet until then, so whoever asks first (the
trainer's set-up, else the first score) waits for all replicas (the health gate).

A thread per replica watches it every ``health_interval_s``: a replica whose server process is
gone, or whose ``/health`` fails three times in a row, leaves routing at once and is restarted
after ``restart_backoff_s`` (doubling after each failed restart, at most
``max_restart_backoff_s``); it rejoins routing only when healthy and on the fleet's weight
version. Clients ask :meth:`ReplicaFleet.urls` for the replicas in routing.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from verl_vllm_rm.client.http import HttpError, get_json
from verl_vllm_rm.replicas.metrics import replica_step_metrics
from verl_vllm_rm.replicas.options import ReplicaOptions, replica_gpus_available
from verl_vllm_rm.replicas.replica import ServerReplica

logger = logging.getLogger(__name__)

FLEET_PREFIX = "vllm_rm_replicas_"
HEALTH_FAILURES_TO_RESTART = 3  # a busy server may miss one /health; a dead process is restarted at once


class FleetError(RuntimeError):
    """The replicas cannot be placed or started; the message says why and what to change."""


@dataclass
class ReplicaStatus:
    index: int
    url: str | None = None
    routed: bool = False  # in routing: healthy and on the fleet's weight version
    healthy: bool = False  # up (its last /health was ok): publishes go to it, on its version or not
    version: int | None = None
    restarts: int = 0
    last_error: str | None = None
    scoring: dict[str, float] = field(default_factory=dict)  # the server's /health counters (since its start)

    def update(self, health: dict[str, Any] | None, fleet_version: int) -> None:
        """Take a ``/health`` answer (None: the replica is down)."""
        self.healthy = health is not None
        if health is not None:
            self.version = health.get("version")
            self.scoring = health.get("scoring", {})
        self.routed = self.healthy and self.version == fleet_version


class ReplicaFleet:
    """The replicas of one reward model (the class of a named, threaded Ray actor)."""

    def __init__(self, name: str, options: ReplicaOptions, api_key: str | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group

        self.name, self.options, self.api_key = name, options, api_key
        self.gpus = options.gpus_on(replica_gpus_available(ray.cluster_resources()))
        bundle = {"CPU": options.cpus_per_replica}
        if self.gpus:
            bundle["GPU"] = self.gpus
        self.group = placement_group([bundle] * options.num_replicas, strategy=options.placement, name=name)
        if not ray.wait([self.group.ready()], timeout=options.startup_timeout_s)[0]:
            ray.util.remove_placement_group(self.group)
            raise FleetError(f"Ray could not place {options.num_replicas} replicas of {bundle} ({options.placement}) "
                             f"within {options.startup_timeout_s:.0f}s on a cluster with {ray.cluster_resources()}: "
                             "lower replicas.num_replicas or the resources per replica")
        nodes = [n for n in ray.nodes() if n["Alive"]]
        self.host = options.host or ("127.0.0.1" if len(nodes) == 1 else None)  # None: each replica's node IP
        self.log_dir = tempfile.mkdtemp(prefix=f"{name}-")
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.replicas = [self._replica_actor(i) for i in range(options.num_replicas)]
        self.status = [ReplicaStatus(i) for i in range(options.num_replicas)]
        starts = [r.start.remote() for r in self.replicas]
        for i, start in enumerate(starts):
            try:
                self.status[i].url = ray.get(start)
            except Exception as e:
                self.stop()
                raise FleetError(f"replica {i} of {name} did not start (logs in {self.log_dir}): {e}") from e
        healths = [self._health(st.url) for st in self.status]
        self.version = max((h or {}).get("version", 0) for h in healths)  # every fresh server starts at 0
        for st, health in zip(self.status, healths):
            st.update(health, self.version)
        self.threads = [threading.Thread(target=self._supervise, args=(i,), daemon=True, name=f"replica-{i}")
                        for i in range(options.num_replicas)]
        for t in self.threads:
            t.start()

    # -- what clients and tests ask ---------------------------------------------------
    def urls(self) -> list[str]:
        """The replicas in routing (healthy, on the fleet's version)."""
        with self.lock:
            return [st.url for st in self.status if st.routed]

    def replica_urls(self) -> list[str]:
        """The replicas that are up, on the fleet's version or not: where a publish goes (and re-syncs)."""
        with self.lock:
            return [st.url for st in self.status if st.healthy]

    def set_version(self, version: int) -> list[str]:
        """The weight version the fleet serves from now on (after a committed publish); returns the URLs in
        routing: the replicas up and on it (each replica's /health is read again first)."""
        healths = [self._health(st.url) for st in self.status]
        with self.lock:
            self.version = version
            for st, health in zip(self.status, healths):
                st.update(health, version)
        return self.urls()

    def replica_status(self, refresh: bool = False) -> list[dict[str, Any]]:
        """Each replica's status as of its supervisor's last ``/health`` (up to ``health_interval_s`` old), or with
        ``refresh`` as of a ``/health`` read now from every replica that answers (a step's metrics need counters
        that include the step's last requests). A replica that does not answer keeps its status: marking it down
        is its supervisor's call."""
        if refresh:
            healths = [self._health(st.url) for st in self.status]
            with self.lock:
                for st, health in zip(self.status, healths):
                    if health is not None:
                        st.update(health, self.version)
        with self.lock:
            return [asdict(st) for st in self.status]

    def server_pids(self) -> list[int | None]:
        import ray

        return ray.get([r.pid.remote() for r in self.replicas])

    def stop(self) -> None:
        """Stop every server and replica actor and free the placement group."""
        import ray

        self.stopping.set()
        for t in getattr(self, "threads", []):
            t.join(timeout=5.0)
        for replica in self.replicas:
            try:
                ray.get(replica.stop.remote(), timeout=60)
            except Exception as e:  # a dead actor's server died with it
                logger.warning("%s: stopping a replica: %s", self.name, e)
            ray.kill(replica)
        ray.util.remove_placement_group(self.group)

    # -- supervision ------------------------------------------------------------------
    def _replica_actor(self, index: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return ray.remote(ServerReplica).options(
            num_cpus=self.options.cpus_per_replica, num_gpus=self.gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=index),
        ).remote(self.options, index, self.host, self.log_dir, self.api_key)

    def _health(self, url: str | None) -> dict[str, Any] | None:
        """The replica's ``/health`` answer when it is ok, else None."""
        try:
            health = get_json(f"{url}/health", timeout_s=5.0)
        except HttpError:
            return None
        return health if isinstance(health, dict) and health.get("status") == "ok" else None

    def _alive(self, index: int) -> bool:
        import ray

        try:
            return ray.get(self.replicas[index].pid.remote(), timeout=30) is not None
        except Exception:  # the actor itself is gone
            return False

    def _supervise(self, index: int) -> None:
        st, misses = self.status[index], 0
        while not self.stopping.wait(self.options.health_interval_s):
            health = self._health(st.url)
            misses = 0 if health else misses + 1
            if health:
                with self.lock:
                    st.update(health, self.version)
                continue
            if misses < HEALTH_FAILURES_TO_RESTART and self._alive(index):
                continue
            with self.lock:
                st.update(None, self.version)
            logger.warning("%s: replica %d (%s) is down: out of routing, restarting", self.name, index, st.url)
            self._restart(index)
            misses = 0

    def _restart(self, index: int) -> None:
        import ray

        st, backoff = self.status[index], self.options.restart_backoff_s
        while not self.stopping.wait(backoff):
            try:
                if not self._alive(index):  # the server died; the actor may have died with it
                    try:
                        ray.get(self.replicas[index].stop.remote(), timeout=60)
                    except Exception:
                        ray.kill(self.replicas[index])
                        self.replicas[index] = self._replica_actor(index)
                url = ray.get(self.replicas[index].start.remote())
            except Exception as e:
                st.last_error = f"{type(e).__name__}: {e}"
                backoff = min(self.options.max_restart_backoff_s, backoff * 2)
                logger.warning("%s: replica %d failed to restart (next try in %.0fs): %s", self.name, index, backoff,
                               st.last_error)
                continue
            health = self._health(url)
            with self.lock:
                st.url, st.restarts = url, st.restarts + 1
                st.update(health, self.version)
            logger.warning("%s: replica %d is back at %s (version %s, %s)", self.name, index, url, st.version,
                           "in routing" if st.routed else "out of routing until re-synced")
            return


class FleetReadings:
    """The run's fleets, started by the trainer, and each step's per-replica metrics (:func:`replica_step_metrics`).

    ``fleets`` maps each managed RM's name to its ``(ReplicaOptions, api_key)``. The constructor starts (or finds)
    every fleet and returns once all of their replicas answer ``/health`` (the health gate), or raises why a fleet
    could not start. Trainer modes ``vllm_rm*`` build it once verl's set-up has placed its own workers, so a fleet
    never takes the GPUs (or nodes) verl's resource pools were sized for.
    """

    def __init__(self, fleets: Mapping[str, tuple[ReplicaOptions, str | None]]) -> None:
        self.fleets = {rm: fleet_for(rm, options, api_key) for rm, (options, api_key) in fleets.items()}
        self.last: dict[str, list[dict[str, Any]]] = {}
        if self.fleets:
            import ray

            ray.get([fleet.urls.remote() for fleet in self.fleets.values()])

    def step_metrics(self) -> dict[str, float]:
        if not self.fleets:
            return {}
        import ray

        out: dict[str, float] = {}
        for rm, fleet in self.fleets.items():
            now = ray.get(fleet.replica_status.remote(refresh=True))
            out.update(replica_step_metrics(rm, now, self.last.get(rm)))
            self.last[rm] = now
        return out


def fleet_name(rm_name: str) -> str:
    return f"{FLEET_PREFIX}{rm_name}"


def fleet_for(rm_name: str, options: ReplicaOptions, api_key: str | None = None) -> Any:
    """The handle of RM ``rm_name``'s fleet: created by the first caller in this Ray job, found by the others."""
    import ray

    return ray.remote(ReplicaFleet).options(
        name=fleet_name(rm_name), get_if_exists=True, num_cpus=0, max_concurrency=16,
    ).remote(fleet_name(rm_name), options, api_key)

