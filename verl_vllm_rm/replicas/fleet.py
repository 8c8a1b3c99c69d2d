"""Reward-server replicas managed on verl's Ray cluster: started once per run, found by name, supervised.

:func:`fleet_for` returns one RM's fleet: a named Ray actor (``vllm_rm_replicas_<rm>``) created
by whichever process asks first (Ray's ``get_if_exists``), so all of verl's reward-loop workers
share one. Trainer modes ``vllm_rm*`` ask first, at set-up (:class:`FleetReadings`); under another
trainer mode the first reward-loop worker to score does. The fleet reserves a placement group with
one bundle per replica (``{"CPU": cpus_per_replica, "GPU": gpus_per_replica}``), starts one
:class:`ServerReplica` actor in each bundle, and its constructor returns only when every replica
answers ``/health``; Ray holds every call to the fleet until then, so whoever asks first (the
trainer's set-up, else the first score) waits for all replicas (the health gate).

A thread per replica watches it every ``health_interval_s``. A ``/health`` unanswered within
``health_timeout_s`` takes the replica out of routing at once (a hung server: alive, port open, no
answer), and it is restarted when its process is gone or it stays silent for ``hung_restart_s``; one
that answers that its weights are lost (a reload that failed half-way and could not be undone: 503) is
restarted at once, and the next publish re-syncs it.
Restarts back off (``restart_backoff_s``, doubling after each failed start, at most
``max_restart_backoff_s``); a replica whose start fails ``max_failed_starts`` times in a row is given
up, and once fewer than ``min_healthy`` replicas remain the fleet fails with their engines' errors. A
replica rejoins routing only when healthy and on the fleet's weight version (a publish re-syncs one
that fell behind). A replica that fails its parity probe after a publish is drained
(:meth:`ReplicaFleet.drain`): out of routing, restarted, re-synced by the next publish. Clients ask
:meth:`ReplicaFleet.urls` for the replicas in routing.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from verl_vllm_rm.client.http import HttpError, get_json
from verl_vllm_rm.protocol.errors import weights_lost
from verl_vllm_rm.replicas.metrics import replica_step_metrics
from verl_vllm_rm.replicas.options import ReplicaOptions, replica_gpus_available
from verl_vllm_rm.replicas.replica import ServerReplica

logger = logging.getLogger(__name__)

FLEET_PREFIX = "vllm_rm_replicas_"


class FleetError(RuntimeError):
    """The replicas cannot be placed or started; the message says why and what to change."""


@dataclass
class ReplicaStatus:
    index: int
    url: str | None = None
    routed: bool = False  # in routing: healthy, on the fleet's weight version, not drained
    healthy: bool = False  # up (its last /health was ok): publishes go to it, on its version or not
    version: int | None = None
    restarts: int = 0
    evictions: int = 0  # times it left routing (a missed /health, a publish it missed, a drain)
    resyncs: int = 0  # times a publish brought it back into routing after it had fallen behind
    failed_starts: int = 0  # failed starts in a row (reset by a good one)
    drained: bool = False  # failed its parity probe: out of routing until restarted
    lagging: bool = False  # seen up on an older version than the fleet's: its next time in routing is a re-sync
    given_up: bool = False  # failed to start max_failed_starts times in a row: not tried again
    last_error: str | None = None
    scoring: dict[str, float] = field(default_factory=dict)  # the server's /health counters (since its start)

    def update(self, health: dict[str, Any] | None, fleet_version: int) -> None:
        """Take a ``/health`` answer (None: the replica is down or hung). Leaving routing counts an eviction, unless
        the replica is ahead of the fleet (it committed a publish the fleet has not moved to yet); coming back into
        routing after it was seen behind counts a re-sync."""
        was_routed = self.routed
        self.healthy = health is not None
        if health is not None:
            self.version = health.get("version")
            self.scoring = health.get("scoring", {})
        known = self.healthy and self.version is not None
        self.lagging = self.lagging or (known and self.version < fleet_version)
        self.routed = known and self.version == fleet_version and not self.drained
        if self.routed and self.lagging:
            self.resyncs, self.lagging = self.resyncs + 1, False
        self.evictions += was_routed and not self.routed and not (known and self.version > fleet_version)


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
            total, free = ray.cluster_resources(), ray.available_resources()
            have = ", ".join(f"{key} {free.get(key, 0):g} free of {total.get(key, 0):g}" for key in bundle)
            raise FleetError(f"Ray could not place {options.num_replicas} replicas of {bundle} ({options.placement}) "
                             f"within replicas.startup_timeout_s={options.startup_timeout_s:g}; the cluster has "
                             f"{have}: lower replicas.num_replicas or the resources per replica "
                             "(replicas.cpus_per_replica, replicas.gpus_per_replica), or give Ray more")
        nodes = [n for n in ray.nodes() if n["Alive"]]
        self.host = options.host or ("127.0.0.1" if len(nodes) == 1 else None)  # None: each replica's node IP
        self.log_dir = tempfile.mkdtemp(prefix=f"{name}-")
        self.lock = threading.Lock()
        self.epoch = 0  # moves with the fleet's version: a /health read before the move is stale (see _supervise)
        self.stopping = threading.Event()
        self.restart_wanted = [threading.Event() for _ in range(options.num_replicas)]
        self.replicas = [self._replica_actor(i) for i in range(options.num_replicas)]
        self.status = [ReplicaStatus(i) for i in range(options.num_replicas)]
        starts = [r.start.remote() for r in self.replicas]
        for st, start in zip(self.status, starts):
            try:
                st.url = ray.get(start)
            except Exception as e:
                st.last_error, st.failed_starts = start_error(e), 1
        failed = [st for st in self.status if st.url is None]
        if options.num_replicas - len(failed) < options.required:
            self.stop()
            raise FleetError(f"{len(failed)} of {options.num_replicas} replicas of {name} did not start, and "
                             f"replicas.min_healthy={options.required} (logs in {self.log_dir}):\n{causes(failed)}"
                             "\nfix the cause the replica's own lines give, or set replicas.min_healthy lower to "
                             "run on the replicas that start")
        for st in failed:
            logger.warning("%s: replica %d did not start; running degraded on %d, retrying it: %s", name, st.index,
                           options.num_replicas - len(failed), st.last_error)
        healths = self._healths()
        self.version = max((h or {}).get("version", 0) for h in healths)  # every fresh server starts at 0
        for st, health in zip(self.status, healths):
            st.update(health, self.version)
        self.threads = [threading.Thread(target=self._supervise, args=(i,), daemon=True, name=f"replica-{i}")
                        for i in range(options.num_replicas)]
        for t in self.threads:
            t.start()

    # -- what clients and tests ask ---------------------------------------------------
    def urls(self) -> list[str]:
        """The replicas in routing (healthy, on the fleet's version, not drained); raises :class:`FleetError` once
        too many replicas were given up."""
        self.check()
        with self.lock:
            return [st.url for st in self.status if st.routed]

    def replica_urls(self) -> list[str]:
        """The replicas that are up and not drained, on the fleet's version or not: where a publish goes (and
        re-syncs); raises like :meth:`urls`."""
        self.check()
        with self.lock:
            return [st.url for st in self.status if st.healthy and not st.drained]

    def check(self) -> None:
        """Raise :class:`FleetError` when fewer than ``min_healthy`` replicas are left (the others given up)."""
        with self.lock:
            lost = [st for st in self.status if st.given_up]
        if self.options.num_replicas - len(lost) >= self.options.required:
            return
        raise FleetError(f"{self.name}: {len(lost)} of {self.options.num_replicas} replicas were given up after "
                         f"{self.options.max_failed_starts} failed starts in a row, leaving fewer than "
                         f"replicas.min_healthy={self.options.required} (logs in {self.log_dir}):\n{causes(lost)}"
                         "\nfix the cause the replica's own lines give, or lower replicas.min_healthy")

    def set_version(self, version: int) -> list[str]:
        """The weight version the fleet serves from now on (after a committed publish); returns the URLs in
        routing: the replicas up and on it (each replica's /health is read again first)."""
        healths = self._healths()
        with self.lock:
            self.version, self.epoch = version, self.epoch + 1
            for st, health in zip(self.status, healths):
                st.update(health, version)
        return self.urls()

    def drain(self, url: str, reason: str) -> None:
        """Take the replica at ``url`` out of routing and restart it (it failed its parity probe: it must not serve
        what it holds); the next publish re-syncs it."""
        with self.lock:
            st = next((st for st in self.status if st.url == url), None)
            if st is None:
                return  # already restarted elsewhere
            was_routed, st.drained, st.last_error = st.routed, True, f"drained: {reason}"
            st.update(None, self.version)
            st.evictions += not was_routed  # a drain is an eviction even of a replica already out (e.g. ahead)
        logger.warning("%s: replica %d (%s) drained and restarting: %s", self.name, st.index, url, reason)
        self.restart_wanted[st.index].set()

    def replica_status(self, refresh: bool = False) -> list[dict[str, Any]]:
        """Each replica's status as of its supervisor's last ``/health`` (up to ``health_interval_s`` old), or with
        ``refresh`` as of a ``/health`` read now from every replica that answers (a step's metrics need counters
        that include the step's last requests). A replica that does not answer keeps its status: marking it down
        is its supervisor's call."""
        if refresh:
            epoch = self.epoch
            healths = self._healths()
            with self.lock:
                for st, health in zip(self.status, healths):
                    if health is not None and self.epoch == epoch:
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
        """The replica's ``/health`` answer when it is ok within ``health_timeout_s``, else None (also for a replica
        that never started: no URL)."""
        return self._reading(url)[0]

    def _reading(self, url: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """:meth:`_health`, and the replica's account when it answered that its weights are lost (a reload failed
        half-way and could not be undone): only a restart brings it back, since it refuses every publish but a full
        one, and the fleet's publishes go to healthy replicas only."""
        if url is None:
            return None, None
        try:
            health = get_json(f"{url}/health", timeout_s=self.options.health_timeout_s)
        except HttpError as e:
            return None, weights_lost(e.status, e.message)
        return (health if isinstance(health, dict) and health.get("status") == "ok" else None), None

    def _healths(self) -> list[dict[str, Any] | None]:
        """Every replica's :meth:`_health`, read at once (a hung replica costs ``health_timeout_s`` once, not once
        per replica behind it)."""
        with ThreadPoolExecutor(len(self.status)) as pool:
            return list(pool.map(self._health, [st.url for st in self.status]))

    def _alive(self, index: int) -> bool:
        import ray

        try:
            return ray.get(self.replicas[index].pid.remote(), timeout=30) is not None
        except Exception:  # the actor itself is gone
            return False

    def _supervise(self, index: int) -> None:
        st, silent_since = self.status[index], None
        if st.url is None:  # it did not start with the fleet (min_healthy let the run go on without it)
            self._restart(index)
        while not st.given_up and not self.stopping.wait(self.options.health_interval_s):
            if self.restart_wanted[index].is_set():
                self._restart(index)
                silent_since = None
                continue
            epoch = self.epoch
            health, lost = self._reading(st.url)
            with self.lock:
                stale = self.epoch != epoch  # read before a publish moved the fleet: it would mark a replica behind
                if not stale:
                    st.update(health, self.version)
            if lost is not None:  # out of routing now; restarted at once (it would never come back by itself)
                logger.warning("%s: replica %d (%s) lost its weights: restarting (%s)", self.name, index, st.url, lost)
                with self.lock:
                    st.last_error = f"weights lost: {lost}"
                self._restart(index)
                silent_since = None
                continue
            if stale:
                continue
            if health:
                silent_since = None
                continue
            now = time.monotonic()
            if silent_since is None:
                silent_since = now
                logger.warning("%s: replica %d (%s) gave no ok /health within %gs (silent, or a 503 such as a "
                               "stalled engine): out of routing", self.name, index, st.url,
                               self.options.health_timeout_s)
            alive = self._alive(index)
            if alive and now - silent_since < self.options.hung_restart_s:
                continue
            logger.warning("%s: replica %d (%s) %s: restarting", self.name, index, st.url,
                           "is hung (no ok /health for %.0fs)" % (now - silent_since) if alive else "is down")
            self._restart(index)
            silent_since = None

    def _restart(self, index: int) -> None:
        """Start replica ``index`` again (stopping what is left of it), backing off after each failed start; give
        it up after ``max_failed_starts`` failures in a row."""
        import ray

        st, backoff = self.status[index], self.options.restart_backoff_s
        self.restart_wanted[index].clear()
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
                with self.lock:
                    st.last_error, st.failed_starts = start_error(e), st.failed_starts + 1
                    st.given_up = st.failed_starts >= self.options.max_failed_starts
                if st.given_up:
                    logger.error("%s: replica %d given up after %d failed starts in a row: %s", self.name, index,
                                 st.failed_starts, st.last_error)
                    return
                backoff = min(self.options.max_restart_backoff_s, backoff * 2)
                logger.warning("%s: replica %d failed to start (next try in %.0fs): %s", self.name, index, backoff,
                               st.last_error)
                continue
            health = self._health(url)
            with self.lock:
                st.url, st.restarts, st.failed_starts, st.drained = url, st.restarts + 1, 0, False
                st.update(health, self.version)
            logger.warning("%s: replica %d is back at %s (version %s, %s)", self.name, index, url, st.version,
                           "in routing" if st.routed else "out of routing until re-synced")
            return


def causes(statuses: list[ReplicaStatus]) -> str:
    """One line per replica: its index and its last error (the server's own words)."""
    return "\n".join(f"replica {st.index}: {st.last_error}" for st in statuses)


def start_error(error: Exception) -> str:
    """What a replica's failed start says: the launcher's error (the server's last log lines), without Ray's
    wrapping of it."""
    cause = getattr(error, "cause", None) or error
    return f"{type(cause).__name__}: {cause}"


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
            ray.get(fleet.check.remote())  # a fleet left with fewer than min_healthy replicas stops the run here
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

