"""``VLLMRewardClient``: the trainer side of ``POST /score`` (imports neither verl nor vllm).

One pooled aiohttp session per event loop, bounded concurrency, batches split by
a sequence and token budget, finite timeouts, retries with exponential backoff
and jitter on connection errors, timeouts, 429 and 5xx (never on other 4xx), and
least-outstanding-requests routing over several servers with fail-over.

A response that is not JSON, carries the wrong number of scores, or a NaN/inf
score is an error (retried like a 5xx), never a number.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import aiohttp

from verl_vllm_rm.scoring.batching import split_by_budget
from verl_vllm_rm.scoring.options import ClientOptions, parse_options

ScoreInput = str | list[int]


class RewardServerError(RuntimeError):
    """Scoring failed; the message names the server(s) and the cause."""


class RewardRequestError(RewardServerError):
    """The server refused the request (a 4xx other than 429): retrying cannot help."""


class _Retryable(Exception):
    def __init__(self, message: str, endpoint_down: bool = False):
        super().__init__(message)
        self.endpoint_down = endpoint_down


@dataclass
class _Endpoint:
    url: str
    outstanding: int = 0
    down_until: float = 0.0


@dataclass
class _LoopState:
    session: aiohttp.ClientSession
    semaphore: asyncio.Semaphore


def _validate_scores(body: Any, n: int) -> list[float]:
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise _Retryable(f"malformed /score response (no 'data' list): {str(body)[:200]}")
    data = body["data"]
    if len(data) != n:
        raise _Retryable(f"/score returned {len(data)} scores for {n} inputs")
    scores: list[float | None] = [None] * n
    for item in data:
        if not isinstance(item, dict):
            raise _Retryable(f"/score returned a non-object item {item!r}")
        idx, score = item.get("index"), item.get("score")
        if not isinstance(idx, int) or not 0 <= idx < n or scores[idx] is not None:
            raise _Retryable(f"/score returned a bad or repeated index {idx!r}")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise _Retryable(f"/score returned a non-finite or non-numeric score {score!r} for input {idx}")
        scores[idx] = float(score)
    return scores  # type: ignore[return-value]


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
            options = parse_options(kwargs, ClientOptions)
        elif server_url is not None or kwargs:
            raise TypeError("pass either options=ClientOptions(...) or keyword options, not both")
        self.options: ClientOptions = options
        self._endpoints = [_Endpoint(u.rstrip("/")) for u in self.options.server_url]
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._publishers: dict[str, Any] = {}

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self._endpoints]

    # -- public API ---------------------------------------------------------------
    async def score(self, item: ScoreInput, *, normalize: bool = False) -> float:
        return (await self.score_batch([item], normalize=normalize))[0]

    async def score_batch(self, items: Sequence[ScoreInput], *, normalize: bool = False) -> list[float]:
        """Scores in input order: raw logits, or sigmoid probabilities with ``normalize``."""
        items = list(items)
        if not items:
            return []
        if not (all(isinstance(x, str) for x in items) or all(isinstance(x, list) for x in items)):
            raise TypeError("score_batch takes all strings or all token-id lists")
        ranges = split_by_budget([len(x) for x in items], self.options.max_batch_seqs, self.options.max_batch_tokens)
        chunks = await asyncio.gather(*(self._score_chunk(items[r.start : r.stop], normalize) for r in ranges))
        return [s for chunk in chunks for s in chunk]

    async def get_model_version(self) -> int:
        body = await self._call("GET", "/runtime_version")
        version = body.get("version") if isinstance(body, dict) else None
        if isinstance(version, bool) or not isinstance(version, int):
            raise RewardServerError(f"/runtime_version returned no integer version: {body!r}")
        return version

    async def health(self) -> dict:
        return await self._call("GET", "/health")

    async def sync_weights(
        self, state_dict: Any, version: int, training_mode: str = "full", **publish_kwargs: Any
    ) -> list[Any]:
        """Publish new reward-model weights into every server of this client, in order.

        A thin async wrapper over :class:`verl_vllm_rm.weight_sync.RewardModelPublisher` (one per
        server, kept between calls; blocking work runs in a thread). Returns one
        ``PublishResult`` per server; raises ``WeightUpdateRefused`` or ``WeightSyncError``.
        """
        from verl_vllm_rm.weight_sync import RewardModelPublisher  # torch: only for users who sync

        loop = asyncio.get_running_loop()
        results = []
        for url in self.urls:
            if url not in self._publishers:
                self._publishers[url] = await loop.run_in_executor(
                    None, lambda: RewardModelPublisher(url, api_key=self.options.api_key)
                )
            publisher = self._publishers[url]
            results.append(await loop.run_in_executor(
                None, lambda: publisher.publish(state_dict, version, training_mode, **publish_kwargs)
            ))
        return results

    async def close(self) -> None:
        """Close this event loop's HTTP session and any weight-sync connections."""
        for publisher in self._publishers.values():
            publisher.close()
        self._publishers.clear()
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.session.close()

    async def __aenter__(self) -> "VLLMRewardClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- internals ----------------------------------------------------------------
    async def _score_chunk(self, chunk: list[ScoreInput], normalize: bool) -> list[float]:
        payload: dict[str, Any] = {"input": chunk, "normalize": normalize}
        if self.options.model:
            payload["model"] = self.options.model
        return await self._call("POST", "/score", payload, validate=lambda body: _validate_scores(body, len(chunk)))

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None or state.session.closed:
            connector = aiohttp.TCPConnector(limit=self.options.max_concurrent_requests * 2, keepalive_timeout=30)
            headers = {"Authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else {}
            state = _LoopState(
                aiohttp.ClientSession(connector=connector, headers=headers),
                asyncio.Semaphore(self.options.max_concurrent_requests),
            )
            self._loops[loop] = state
        return state

    def _pick(self, avoid: _Endpoint | None = None) -> _Endpoint:
        """Least outstanding among the servers that look up; a retry avoids the one that just failed."""
        now = time.monotonic()
        up = [e for e in self._endpoints if e.down_until <= now]
        up = [e for e in up if e is not avoid] or up  # a slow (timed-out) server is not marked down
        if not up:  # every server looks down: try the one that went down first
            return min(self._endpoints, key=lambda e: e.down_until)
        least = min(e.outstanding for e in up)
        return random.choice([e for e in up if e.outstanding == least])

    async def _call(
        self, method: str, path: str, payload: Any = None, validate: Callable[[Any], Any] | None = None
    ) -> Any:
        opts, state = self.options, self._state()
        deadline = time.monotonic() + opts.deadline_s
        errors: list[str] = []
        failed: _Endpoint | None = None
        async with state.semaphore:
            for attempt in range(opts.max_retries + 1):
                endpoint = self._pick(avoid=failed)
                try:
                    body = await self._once(state.session, endpoint, method, path, payload, deadline)
                    return validate(body) if validate else body
                except _Retryable as e:
                    errors.append(f"{endpoint.url}: {e}")
                    failed = endpoint
                    if e.endpoint_down:
                        endpoint.down_until = time.monotonic() + opts.endpoint_cooldown_s
                delay = min(opts.backoff_max_s, opts.backoff_base_s * 2**attempt) * random.uniform(0.5, 1.0)
                if attempt == opts.max_retries or time.monotonic() + delay >= deadline:
                    break
                await asyncio.sleep(delay)
        raise RewardServerError(
            f"{method} {path} failed after {len(errors)} attempt(s) (servers {self.urls}); "
            f"last error: {errors[-1]}"
        )

    async def _once(self, session, endpoint: _Endpoint, method: str, path: str, payload: Any, deadline: float) -> Any:
        opts = self.options
        remaining = deadline - time.monotonic()
        timeout = aiohttp.ClientTimeout(
            total=max(0.001, min(opts.request_timeout_s, remaining)),
            sock_connect=opts.connect_timeout_s,
            sock_read=opts.read_timeout_s,
        )
        endpoint.outstanding += 1
        try:
            async with session.request(method, endpoint.url + path, json=payload, timeout=timeout) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as e:
            raise _Retryable(f"connection failed: {type(e).__name__}: {e}", endpoint_down=True) from None
        except asyncio.TimeoutError:
            raise _Retryable(f"timed out (request {opts.request_timeout_s}s / read {opts.read_timeout_s}s)") from None
        except aiohttp.ClientError as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from None
        finally:
            endpoint.outstanding -= 1
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {text[:300]}")
        if status >= 400:
            raise RewardRequestError(f"{method} {endpoint.url}{path} was refused with HTTP {status}: {text[:500]}")
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise _Retryable(f"response is not JSON: {text[:200]!r}") from None
