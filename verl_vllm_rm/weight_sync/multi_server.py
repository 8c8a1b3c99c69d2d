"""One reward model published into its servers: one phase for one server, a two-phase commit for several.

With several servers, never two versions serve: every server first receives and stages the
version (``publish(..., commit=False)``: the old weights keep serving), and only when all have
staged it do all apply it (``commit``). If a server refuses the update, one failure aborts the
version everywhere: all keep serving the old one and the error is raised. A server that fails
for another reason (it died, hung, its transfer broke) does the same on a fixed list by default;
with ``leave_behind`` (``online_rm.on_server_failure=leave_behind``), and always with managed
replicas (``on_commit`` given: the fleet routes only the replicas on its version), it is left
behind instead: the others commit, and the next publish re-syncs it (a fresh session: its server
list comes from ``server_urls`` again each time). Nothing routes to it meanwhile: the fleet
routes the replicas on its version, and a client over a fixed list sends requests only to the
servers on the newest version (:func:`verl_vllm_rm.client.endpoints.on_newest_version`). With
managed replicas, a server that fails the parity probe while others pass is handed to
``on_parity_failure`` (the fleet drains and restarts it) instead of failing the publish.

A server that leaves the list (down, hung) has its session closed in the background: cleanup
aimed at a dead or hung peer is logged, never raised, and never holds up a training step.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch.distributed as dist

from verl_vllm_rm.parity.probe import ParityProbe, coarsest
from verl_vllm_rm.protocol.inventory import WeightUpdateRefused
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.weight_sync.publisher import ClosedOnExit, PublishResult, RewardModelPublisher
from verl_vllm_rm.weight_sync.outgoing import StateDictLike
from verl_vllm_rm.weight_sync.transfer import WeightSyncError

logger = logging.getLogger(__name__)

ServerList = Sequence[str] | Callable[[], Sequence[str]]


class MultiServerPublisher(ClosedOnExit):
    """Publishers to several servers, kept between publishes, updated together.

    ``MultiServerPublisher(client.urls, api_key=...)`` keeps the servers of a client on the same
    weights; ``server_urls`` may also be a function giving today's servers (managed replicas).
    Any other keyword goes to every :class:`RewardModelPublisher`, except ``parity_probe``, which
    this class runs once per publish against every server. Blocking, like the publisher.
    """

    def __init__(self, server_urls: ServerList, *, on_commit: Callable[[int], None] | None = None,
                 on_parity_failure: Callable[[str, str], None] | None = None, leave_behind: bool = False,
                 parity_probe: ParityProbe | None = None, **publisher_kwargs: Any) -> None:
        if on_parity_failure is not None and on_commit is None:
            raise ValueError("on_parity_failure drains a server from routing: it needs on_commit (servers routed "
                             "by weight version, i.e. managed replicas)")
        self._server_urls = server_urls if callable(server_urls) else (lambda: list(server_urls))
        self.on_commit = on_commit
        #: a server that fails (but does not refuse) is left behind, the publish goes on: asked, or managed replicas
        self.leave_behind = leave_behind or on_commit is not None
        #: the servers the last publish left behind (out of routing until the next publish re-syncs them)
        self.left_behind: list[str] = []
        self.on_parity_failure = on_parity_failure
        self.parity_probe = parity_probe
        self.publisher_kwargs = publisher_kwargs
        self.publishers: dict[str, RewardModelPublisher] = {}
        self.publishes = 0
        self._sync_servers()
        self.version = max(p.version for p in self.publishers.values())

    # -- the servers of the day ------------------------------------------------------
    def _sync_servers(self) -> None:
        """Publishers to today's servers: new ones opened (each reads the server's inventory, in parallel), gone
        ones discarded. A server that cannot be opened fails the publish, or with ``leave_behind`` is left behind
        (out of routing: it is not on the new version) and tried again at the next publish.
        The ranks of a sharded trainer keep the servers every rank could open: they publish together."""
        urls = list(dict.fromkeys(self._server_urls()))  # a URL listed twice is one server
        if not urls:
            raise ValueError("MultiServerPublisher needs at least one server URL, and server_urls gave none: pass "
                             "the servers' URLs (with managed replicas, none is up and in routing now)")
        opened, failed = self._open([url for url in urls if url not in self.publishers])
        refused = [e for e in failed.values() if isinstance(e, WeightUpdateRefused)]
        if failed and (not self.leave_behind or refused):
            for url, pub in opened.items():
                close_quietly(url, pub)
            raise (refused or list(failed.values()))[0]
        usable = servers_on_every_rank({url for url in urls if url in self.publishers or url in opened},
                                       self.publisher_kwargs.get("group"))
        for url in set(self.publishers) - usable:
            self._discard(url)
        for url, pub in opened.items():
            if url in usable:
                self.publishers[url] = pub
            else:
                close_quietly(url, pub)
        for url, error in failed.items():
            logger.warning("server %s left behind (out of routing until re-synced): could not open its weight-sync "
                           "session: %s", url, error)
        self.left_behind = list(failed)
        if not self.publishers:
            detail = "; ".join(f"{url}: {type(e).__name__}: {e}" for url, e in failed.items())
            raise WeightSyncError(f"no server could take weight updates ({detail or 'the trainer ranks share none'})"
                                  "; every server serves its old version")

    def _open(self, urls: list[str]) -> tuple[dict[str, RewardModelPublisher], dict[str, Exception]]:
        """A publisher to each of ``urls`` (opened in parallel: a hung server costs its timeout once), and the
        error of each that could not be opened."""
        results = results_or_errors(lambda url: RewardModelPublisher(url, **self.publisher_kwargs),
                                    {url: url for url in urls}, parallel=True)
        opened = {url: r for url, r in results.items() if not isinstance(r, Exception)}
        return opened, {url: r for url, r in results.items() if isinstance(r, Exception)}

    def _discard(self, url: str) -> None:
        """Forget the server's publisher; its session is closed in the background (a dead or hung server may never
        answer), any error logged: the next publish to it starts a fresh session, which re-syncs it."""
        threading.Thread(target=close_quietly, args=(url, self.publishers.pop(url)), daemon=True,
                         name=f"close-{url}").start()

    @property
    def leader(self) -> bool:
        """Rank 0 of the trainer: it alone talks to the servers' control plane (commits, and the fleet with
        ``on_commit`` / ``on_parity_failure``: another rank's call could move the fleet before rank 0's commit)."""
        return all(p.rank == 0 for p in self.publishers.values())

    @property
    def distributed(self) -> bool:
        return any(p.world_size > 1 for p in self.publishers.values())

    def _each(self, fn: Callable[[RewardModelPublisher], Any], parallel: bool) -> dict[str, Any]:
        """``fn`` on every publisher: its result or the exception it raised, by URL."""
        return results_or_errors(fn, self.publishers, parallel)

    # -- publishing ------------------------------------------------------------------
    def publish(
        self,
        state_dict: StateDictLike,
        version: int,
        training_mode: RewardModelTrainingMode | str = RewardModelTrainingMode.FULL,
        *,
        probe_ids: Sequence[Sequence[int]] | None = None,
        **publish_kwargs: Any,
    ) -> list[PublishResult]:
        """Publish ``version`` to today's servers; one result per server that serves it.

        One server receives and applies it in one phase. Several are updated with a two-phase
        commit (:meth:`_stage_and_commit`): never two versions serving. Then the parity probe, when
        due, compares the model with every server that serves it.
        """
        t0 = time.monotonic()
        self._sync_servers()
        probe_due = self.parity_probe is not None and self.parity_probe.due(self.publishes + 1, state_dict, probe_ids)
        if len(self.publishers) == 1:
            ((url, pub),) = self.publishers.items()
            try:
                results = {url: pub.publish(state_dict, version, training_mode, **publish_kwargs)}
            except Exception as e:
                raise self._error({url: e}, version, "it serves the old version") from e
        else:
            results = self._stage_and_commit(state_dict, version, training_mode, publish_kwargs)
        self.version = version
        self.publishes += 1
        if self.on_commit is not None and self.leader:
            self.on_commit(version)  # the fleet routes the replicas on this version only
        figures: dict[str, dict[str, Any]] = {}
        if probe_due:
            figures, drained = self._probe(state_dict, probe_ids, list(results), version)
            results = {url: r for url, r in results.items() if url not in drained}
        return [replace(r, seconds=time.monotonic() - t0, parity=figures.get(url)) for url, r in results.items()]

    def _probe(self, model: Any, probe_ids: Sequence[Sequence[int]], urls: list[str],
               version: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """The parity probe on every server that serves ``version``: the figures of those that pass (rank 0's) and
        the servers drained. With
        ``on_parity_failure``, servers that fail while another passes are drained (and their sessions dropped, so
        the next publish re-syncs them); otherwise any failure is raised on every rank."""
        first = next(iter(self.publishers.values()))
        figures, failures = self.parity_probe.check(
            model, probe_ids, urls, first.api_key, version, leader=first.rank == 0,
            server_dtype=coarsest(*(p.server_dtype for p in self.publishers.values())))
        drain = self.on_parity_failure is not None and len(failures) < len(urls)
        first.agree(None if drain or not failures else next(iter(failures.values())))
        drained = first.share({url: str(e) for url, e in failures.items()})
        for url, reason in drained.items():
            logger.warning("version %d: server %s failed its parity probe: drained (%s)", version, url, reason)
            if self.leader:
                self.on_parity_failure(url, reason)
            self._discard(url)
        return figures, list(drained)

    def _stage_and_commit(self, state_dict: StateDictLike, version: int, training_mode: Any,
                          publish_kwargs: dict[str, Any]) -> dict[str, PublishResult]:
        """Stage ``version`` on every server, then apply it on all.

        The tensors go to the servers in parallel (one thread each) unless the trainer is
        distributed (its ranks gather shards together, so servers are served one after another).
        """
        staged = self._each(lambda p: p.publish(state_dict, version, training_mode, commit=False, **publish_kwargs),
                            parallel=not self.distributed)
        failed = {url: r for url, r in staged.items() if isinstance(r, Exception)}
        refused = any(isinstance(e, WeightUpdateRefused) for e in failed.values())
        if failed and (refused or not self.leave_behind or len(failed) == len(staged)):
            self._abort([url for url in staged if url not in failed], version)
            raise self._error(failed, version, "none of the servers applied it; they all serve the old version")
        for url, error in failed.items():
            logger.warning("version %d: server %s left behind (out of routing until re-synced): %s",
                           version, url, error)
            self._discard(url)  # a fresh session re-syncs it at the next publish
        commits = self._each(lambda p: p.commit(version), parallel=True)
        broken = {url: r for url, r in commits.items() if isinstance(r, Exception)}
        if broken and (not self.leave_behind or len(broken) == len(commits)):  # left behind: while one commits
            raise self._error(broken, version, "the other servers applied it" if len(broken) < len(commits)
                              else "none of the servers applied it")
        for url, error in broken.items():
            logger.warning("version %d: server %s left behind at its commit (out of routing until re-synced): %s",
                           version, url, error)
            self._discard(url)
        self.left_behind += [*failed, *broken]
        return {url: replace(staged[url], server=commits[url]) for url in commits if url not in broken}

    def _abort(self, urls: list[str], version: int) -> None:
        for url in urls:
            try:
                self.publishers[url].abort(version)
            except Exception as e:  # it still refuses every other update until aborted: say so loudly
                logger.error("could not abort staged version %d on %s: %s", version, url, e)

    @staticmethod
    def _error(failures: dict[str, Exception], version: int, outcome: str) -> Exception:
        detail = "; ".join(f"{url}: {type(e).__name__}: {e}" for url, e in failures.items())
        message = f"version {version} failed on {len(failures)} server(s) ({detail}); {outcome}"
        refused = all(isinstance(e, WeightUpdateRefused) for e in failures.values())
        return WeightUpdateRefused(message) if refused else WeightSyncError(message)

    def close(self) -> None:
        """Close every publisher's session (each one; a server that cannot be reached is logged, not raised: the run
        is over for it either way)."""
        for url, pub in self.publishers.items():
            close_quietly(url, pub)


def results_or_errors(fn: Callable[[Any], Any], args: dict[str, Any], parallel: bool) -> dict[str, Any]:
    """``fn(arg)`` for each ``{url: arg}``: its result or the exception it raised, by URL (``parallel``: one thread
    each)."""
    def run(arg: Any) -> Any:
        try:
            return fn(arg)
        except Exception as e:
            return e

    if parallel and len(args) > 1:
        with ThreadPoolExecutor(len(args)) as pool:
            return dict(zip(args, pool.map(run, args.values())))
    return {url: run(arg) for url, arg in args.items()}


def servers_on_every_rank(urls: set[str], group: dist.ProcessGroup | None) -> set[str]:
    """The servers every rank of the trainer's group has (a rank alone: ``urls``): the ranks of a sharded trainer
    gather shards together, so they must publish to the same servers even when one rank could not reach one."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return urls
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, sorted(urls), group=group)
    return set.intersection(*(set(u) for u in every))


def close_quietly(url: str, publisher: RewardModelPublisher) -> None:
    """Close a publisher's session; a server that cannot be reached is logged, not raised (nothing is left to
    undo there: a dropped session only means the next publish to it starts afresh)."""
    try:
        publisher.close()
    except Exception as e:
        logger.warning("closing the weight-sync session of %s: %s", url, e)
