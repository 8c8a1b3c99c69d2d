"""``VLLMRewardClient``: the trainer side of ``POST /score`` (imports neither verl nor vllm).

One pooled session per event loop, bounded concurrency, finite timeouts, retries
with exponential backoff and jitter on connection errors, timeouts, 429 and 5xx
(never on other 4xx), and least-outstanding-requests routing over several servers
with fail-over. A request a server has not answered after ``failover_after_s`` has that server's
``/health`` checked (``health_timeout_s``): a hung server (no answer) is taken out of routing and the
request goes to another server, so a hung server never holds a request for the read timeout; it
rejoins routing once its ``/health`` answers again. Each attempt goes through
:mod:`verl_vllm_rm.client.http`.

Requests go only to the servers on the newest weight version among those up
(:func:`~verl_vllm_rm.client.endpoints.on_newest_version`): each
``/score`` answer and ``/health`` says its server's version, and a server seen on an older one (left behind by a
publish, or restarted from the checkpoint on disk) gets no request until its ``/health`` shows the newest; it is
asked again once another server shows a newer version and then every ``endpoint_cooldown_s``, together with every
other server (whose version may have moved since its last answer). When no server up is on a newer version than
it, it serves (a run whose only live server is the one left behind scores with its weights, each score labelled
with its version). A server left behind that this client never saw fail or answer behind passes for current until
another server's answer shows the newer version: each score carries the version that computed it. The server list is
fixed (``server_url``) or follows a source (:meth:`VLLMRewardClient.follow`: managed
replicas), asked again at most once a second (a due answer is awaited: no request routes on an older list).

``score_request`` sends its items as one ``/score`` request; ``score_batch`` first
splits them by the sequence and token budget (the group batcher splits on its own
and calls ``score_request``).

A response that is not JSON, carries the wrong number of scores, or a NaN/inf
score is an error (retried like a 5xx), never a number.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

import numpy as np

from verl_vllm_rm.client import http
from verl_vllm_rm.protocol.score import ScoreResponseError, Scores, parse_score_response
from verl_vllm_rm.client.batching import split_by_budget
from verl_vllm_rm.client.endpoints import Endpoint, endpoint_stats, on_newest_version
from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.options import build

if TYPE_CHECKING:
    import aiohttp

ScoreInput = str | list[int] | np.ndarray  # a text, or token ids (a list or a 1-D integer array)


def _is_ids(x: Any) -> bool:
    return isinstance(x, list) or (isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "iu")


class RewardServerError(RuntimeError):
    """Scoring failed; the message names the server(s) and the cause."""


class RewardRequestError(RewardServerError):
    """The server refused the request (a 4xx other than 429): retrying cannot help."""


class _Retryable(Exception):
    def __init__(self, message: str, endpoint_down: bool = False):
        super().__init__(message)
        self.endpoint_down = endpoint_down


@dataclass
class _Trace:
    """What one request met on its way: how often it moved to another server after a failure, and the server
    that answered."""

    failovers: int = 0
    answered: Endpoint | None = None


@dataclass
class _LoopState:
    session: aiohttp.ClientSession
    semaphore: asyncio.Semaphore


def _validate_scores(body: Any, n: int) -> Scores:
    try:
        return parse_score_response(body, n)
    except ScoreResponseError as e:
        raise _Retryable(str(e)) from None


class VLLMRewardClient:
    """Async client for one or more ``verl_vllm_rm.server`` instances.

    ``VLLMRewardClient("http://127.0.0.1:8001")`` or with a list of URLs; every
    other keyword is a :class:`~verl_vllm_rm.scoring.options.ClientOptions` field.
    """

    def __init__(
        self, server_url: str | Sequence[str] | None = None, *, options: ClientOptions | None = None, **kwargs: Any
    ):
        if options is None:
            if server_url is not None:
                kwargs["server_url"] = server_url
            options = build(ClientOptions, kwargs, "reward_kwargs")
        elif server_url is not None or kwargs:
            raise TypeError("pass either options=ClientOptions(...) or keyword options, not both")
        self.options: ClientOptions = options
        self._endpoints = [Endpoint(u.rstrip("/")) for u in self.options.server_url]  # the servers routed over
        self._seen: dict[str, Endpoint] = {e.url: e for e in self._endpoints}  # every server ever routed over
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._source: Callable[[], Awaitable[list[str]]] | None = None
        self._refresh_s, self._refreshed = 1.0, -math.inf
        self._pending: asyncio.Future | None = None
        self._newest_since = -math.inf  # when a server was first seen on the newest version known

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self._endpoints]

    # -- public API ---------------------------------------------------------------
    async def score(self, item: ScoreInput, *, normalize: bool = False) -> float:
        return (await self.score_batch([item], normalize=normalize))[0]

    async def score_batch(self, items: Sequence[ScoreInput], *, normalize: bool = False) -> list[float]:
        """Scores in input order: raw logits, or sigmoid probabilities with ``normalize``.

        Sent as concurrent requests of at most ``max_batch_seqs`` items and ``max_batch_tokens`` summed length.
        """
        items = list(items)
        ranges = split_by_budget([len(x) for x in items], self.options.max_batch_seqs, self.options.max_batch_tokens)
        chunks = await asyncio.gather(*(self.score_request(items[r.start : r.stop], normalize=normalize)
                                        for r in ranges))
        return [s for chunk in chunks for s in chunk]

    async def score_request(self, chunk: Sequence[ScoreInput], *, normalize: bool = False) -> Scores:
        """Score ``chunk`` in ONE ``/score`` request (retried as a whole): the caller keeps it within budget.

        The scores carry ``version``, the server's weight version that computed them, and ``failovers``, how often
        the request moved to another server after a failure."""
        chunk = list(chunk)
        if not chunk:
            return Scores()
        if not (all(isinstance(x, str) for x in chunk) or all(_is_ids(x) for x in chunk)):
            raise TypeError("a /score request takes all strings or all token-id lists (or 1-D integer arrays)")
        payload: dict[str, Any] = {"input": chunk, "normalize": normalize}
        if self.options.model:
            payload["model"] = self.options.model
        trace = _Trace()
        scores = await self._call("POST", "/score", payload, validate=lambda body: _validate_scores(body, len(chunk)),
                                  trace=trace)
        scores.failovers = trace.failovers
        self._saw_version(trace.answered, scores.version)
        return scores

    async def post(self, path: str, payload: Any, validate: Callable[[Any], Any] | None = None) -> Any:
        """POST ``payload`` to ``path`` (e.g. a judge's ``/v1/chat/completions``) with this client's routing,
        retries and deadline; ``validate`` reads the answer, and an exception it raises is not retried."""
        return await self._call("POST", path, payload, validate=validate)

    async def get_model_version(self) -> int:
        body = await self._call("GET", "/runtime_version")
        version = body.get("version") if isinstance(body, dict) else None
        if isinstance(version, bool) or not isinstance(version, int):
            # internal: a peer answering out of protocol (our server's /runtime_version is always {"version": int})
            raise RewardServerError(f"/runtime_version returned no integer version: {body!r}")
        return version

    async def health(self) -> dict:
        return await self._call("GET", "/health")

    def endpoint_stats(self) -> dict[str, dict[str, float]]:
        """Per server ever routed over (one a source dropped keeps its figures, and its hung mark should it come
        back): requests sent, in flight now, failed, failed over from it, abandoned because it hung, the mean latency
        in ms (per-replica metrics), and the seconds left of its ``endpoint_cooldown_s`` (0.0: it may be picked)."""
        return {e.url: endpoint_stats(e, time.monotonic()) for e in self._seen.values()}

    def follow(self, source: Callable[[], Awaitable[list[str]]], refresh_s: float = 1.0) -> None:
        """Route over the URLs ``source()`` gives (the replicas in routing), asked again at most every
        ``refresh_s``; requests wait for its first answer."""
        self._source, self._refresh_s, self._refreshed, self._endpoints = source, refresh_s, -math.inf, []
        self._seen = {}

    async def close(self) -> None:
        """Close this event loop's HTTP session."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.session.close()

    async def __aenter__(self) -> "VLLMRewardClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- internals ----------------------------------------------------------------
    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None or state.session.closed:
            state = _LoopState(
                http.open_session(self.options.api_key, max_connections=self.options.max_concurrent_requests * 2),
                asyncio.Semaphore(self.options.max_concurrent_requests),
            )
            self._loops[loop] = state
        return state

    async def _refresh(self) -> None:
        """Ask the source for the servers (at most every ``refresh_s``; one question at a time, which every request
        of that moment awaits: a list older than ``refresh_s`` is never used, so a replica that fell behind while
        this client was idle, e.g. between two steps, gets no request)."""
        now = time.monotonic()
        if self._pending is None and now - self._refreshed >= self._refresh_s:
            self._refreshed = now
            self._pending = asyncio.ensure_future(self._source())
        pending = self._pending
        if pending is None:
            return
        try:
            urls = await asyncio.shield(pending)
        except Exception as e:
            if not self._endpoints:
                raise RewardServerError(f"the reward servers' source failed: {e}") from e
            urls = []
        finally:
            if self._pending is pending:
                self._pending = None
        if urls:
            self._endpoints = [self._seen.setdefault(u.rstrip("/"), Endpoint(u.rstrip("/"))) for u in urls]

    def _saw_version(self, endpoint: Endpoint | None, version: int | None) -> None:
        """``endpoint`` serves ``version`` (a /score answer or a /health said so)."""
        if endpoint is None or version is None:
            return
        others = [e.version for e in self._endpoints if e is not endpoint and e.version is not None]
        if version > max(others, default=-math.inf) and (endpoint.version is None or version > endpoint.version):
            self._newest_since = time.monotonic()  # every other server is asked for its version again
        endpoint.version, endpoint.version_read = version, time.monotonic()

    async def _pick(self, session, avoid: Endpoint | None = None) -> Endpoint:
        """Least outstanding among the servers that look up and are on the newest version; a retry avoids the one
        that just failed. A server whose version may have caught up has its ``/health`` read first."""
        if not self._endpoints:
            raise _Retryable("no reward server in routing yet: the followed source lists none (managed replicas still "
                             "starting, or every one out of routing; their own log lines say why)", endpoint_down=False)
        now = time.monotonic()
        up = [e for e in self._endpoints if e.down_until <= now]
        if not up:  # every server looks down: try the one that went down first
            return min(self._endpoints, key=lambda e: e.down_until)
        routable, to_check = on_newest_version(up, self._newest_since, now, self.options.endpoint_cooldown_s)
        if to_check:
            # whether each caught up; the others are read with them, since the version a server behind is compared
            # with may itself be old (a publish since its last answer: a server frozen through a publish that left
            # it behind must not pass for current once thawed). Asked once: the requests picking meanwhile do not ask
            # again (they route to the servers known current, or wait for the next pick)
            read = [e for e in up if e in to_check or e in routable]
            for e in read:
                e.version_read = now
            await asyncio.gather(*(self._answers_health(session, e) for e in read))
            routable, _ = on_newest_version(up, self._newest_since, time.monotonic(), math.inf)
        # a slow (timed-out) server is not marked down: a retry goes elsewhere when another is on the newest version
        routable = [e for e in routable if e is not avoid] or routable
        least = min(e.outstanding for e in routable)
        return random.choice([e for e in routable if e.outstanding == least])

    async def _call(
        self, method: str, path: str, payload: Any = None, validate: Callable[[Any], Any] | None = None,
        trace: _Trace | None = None,
    ) -> Any:
        opts, state = self.options, self._state()
        deadline = time.monotonic() + opts.deadline_s
        errors: list[str] = []
        failed: Endpoint | None = None
        ended = ""  # which bound ended the retries
        async with state.semaphore:
            for attempt in range(opts.max_retries + 1):
                endpoint = None
                try:
                    if self._source is not None:
                        await self._refresh()
                    endpoint = await self._pick(state.session, avoid=failed)
                    if failed is not None and endpoint is not failed:
                        failed.failovers += 1
                        if trace is not None:
                            trace.failovers += 1
                    if endpoint.hung and not await self._answers_health(state.session, endpoint):
                        raise _Retryable(f"/health did not answer within {opts.health_timeout_s:g}s (hung)",
                                         endpoint_down=True)
                    body = await self._once(state.session, endpoint, method, path, payload, deadline)
                    answer = validate(body) if validate else body
                    if trace is not None:
                        trace.answered = endpoint
                    return answer
                except _Retryable as e:
                    errors.append(f"{endpoint.url if endpoint else '(no server)'}: {e}")
                    failed = endpoint
                    if e.endpoint_down:
                        endpoint.down_until = time.monotonic() + opts.endpoint_cooldown_s
                delay = min(opts.backoff_max_s, opts.backoff_base_s * 2**attempt) * random.uniform(0.5, 1.0)
                if attempt == opts.max_retries:
                    ended = f"max_retries {opts.max_retries} used up"
                    break
                if time.monotonic() + delay >= deadline:
                    ended = f"deadline_s {opts.deadline_s:g} s ran out"
                    break
                if failed is not None and any(e is not failed and e.down_until <= time.monotonic()
                                              for e in self._endpoints):
                    delay = 0.0  # another server looks up: fail over now
                await asyncio.sleep(delay)
        raise RewardServerError(
            f"{method} {path} failed after {len(errors)} attempt(s), {ended} (servers {self.urls}); "
            f"last error: {errors[-1]}"
        )

    async def _answers_health(self, session, endpoint: Endpoint) -> bool:
        """Whether the server answers ``/health`` ok within ``health_timeout_s`` (a hung server does not); an answer
        clears its hung mark and says its weight version."""
        limit = self.options.health_timeout_s
        try:
            body = await http.request_json(session, "GET", endpoint.url + "/health", total_s=limit,
                                           connect_s=limit, read_s=limit)
        except http.HttpError:
            return False
        ok = isinstance(body, dict) and body.get("status") == "ok"
        endpoint.hung = endpoint.hung and not ok
        if ok and isinstance(body.get("version"), int) and not isinstance(body.get("version"), bool):
            self._saw_version(endpoint, body["version"])
        return ok

    async def _once(self, session, endpoint: Endpoint, method: str, path: str, payload: Any, deadline: float) -> Any:
        """One attempt; a failure is either worth a retry or a refusal (:class:`RewardRequestError`). An attempt
        unanswered after ``failover_after_s`` is abandoned when the server does not answer ``/health`` either."""
        opts = self.options
        endpoint.outstanding += 1
        endpoint.requests += 1
        t0 = time.perf_counter()
        attempt = asyncio.ensure_future(http.request_json(
            session, method, endpoint.url + path, payload,
            total_s=max(0.001, min(opts.request_timeout_s, deadline - time.monotonic())),
            connect_s=opts.connect_timeout_s, read_s=opts.read_timeout_s,
        ))
        try:
            while not (await asyncio.wait({attempt}, timeout=opts.failover_after_s))[0]:
                if not await self._answers_health(session, endpoint):
                    endpoint.hung = True
                    endpoint.hangs += 1
                    raise _Retryable(f"no answer after {opts.failover_after_s:g}s and /health did not answer within "
                                     f"{opts.health_timeout_s:g}s (hung)", endpoint_down=True)
            return attempt.result()
        except http.HttpError as e:
            endpoint.failures += 1
            if not e.transient:
                raise RewardRequestError(f"{method} {e.url} was refused with {e.cause}") from None
            raise _Retryable(e.cause, endpoint_down=e.unreachable) from None
        except _Retryable:
            endpoint.failures += 1
            raise
        finally:
            if not attempt.done():
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
            endpoint.outstanding -= 1
            endpoint.busy_s += time.perf_counter() - t0
