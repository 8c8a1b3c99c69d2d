"""The trainer side's one HTTP layer: auth header, error reading, JSON calls.

Two shapes of call, one error type (:class:`HttpError`) and one reading of
error bodies (:func:`verl_vllm_rm.protocol.errors.error_message`):

* synchronous (urllib) for the control plane: a publish runs inside a training
  step (no event loop), the launcher polls ``/health``, the CLI scores once;
  :class:`JsonHttp` (``get``/``post``/``post_lines``), :func:`get_json`, and
  :func:`served_versions` (the weight version each of several servers serves).
* one asynchronous attempt (aiohttp) for the scoring client, whose retry loop,
  routing and fail-over sit above it: :func:`open_session` and :func:`request_json`.

Every call has a finite timeout. :func:`free_port` finds a port to listen on (a launched server, a
weight-transfer rendezvous).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import http.client
import json
import random
import socket
import weakref
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import aiohttp
import orjson

from verl_vllm_rm.protocol.errors import error_message


class HttpError(RuntimeError):
    """A call that got no usable answer.

    ``status`` is the HTTP status of an error answer, whose ``message`` is the
    server's own; None when no usable answer came (``message`` names the cause,
    and ``unreachable`` says the server could not be reached or dropped the
    connection).
    """

    def __init__(self, url: str, message: str, status: int | None = None, *, unreachable: bool = False):
        self.url = url
        self.message = message
        self.status = status
        self.unreachable = unreachable
        super().__init__(f"{url}: {self.cause}")

    @property
    def cause(self) -> str:
        return self.message if self.status is None else f"HTTP {self.status}: {self.message}"

    @property
    def transient(self) -> bool:
        """Worth another attempt: no answer, 429 (busy) or a 5xx; any other 4xx is a refusal."""
        return self.status is None or self.status == 429 or self.status >= 500


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _decode(text: str | bytes, url: str, loads: Callable[[str | bytes], Any] = json.loads) -> Any:
    try:
        return loads(text)
    except ValueError:
        head = text[:200].decode(errors="replace") if isinstance(text, bytes) else text[:200]
        raise HttpError(url, f"response is not JSON: {head!r}") from None


# -- synchronous -------------------------------------------------------------------------------


@contextmanager
def _answer(url: str, body: Any, api_key: str | None, timeout_s: float) -> Iterator[http.client.HTTPResponse]:
    """The open response; any failure while sending or reading it becomes :class:`HttpError`."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **auth_headers(api_key)}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout_s) as resp:
            yield resp
    except urllib.error.HTTPError as e:
        raise HttpError(url, error_message(e.read()), e.code) from None
    except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, cut short
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise HttpError(url, f"{type(reason).__name__}: {reason}",
                        unreachable=isinstance(e, (urllib.error.URLError, ConnectionError))) from None


def get_json(url: str, timeout_s: float = 5.0, api_key: str | None = None) -> Any:
    """``GET url`` once: the decoded answer, or :class:`HttpError`."""
    with _answer(url, None, api_key, timeout_s) as resp:
        return _decode(resp.read(), url)


def served_versions(urls: list[str], api_key: str | None = None, timeout_s: float = 5.0) -> dict[str, int]:
    """The weight version each of ``urls`` serves, of those whose ``/health`` answers ok within ``timeout_s``: a
    server down, hung, whose engine stalled or whose weights are lost (503) is left out, as it scores nothing."""
    versions: dict[str, int] = {}
    for url in urls:
        try:
            health = get_json(f"{url.rstrip('/')}/health", timeout_s, api_key)
        except HttpError:  # unreachable, or not ok (503)
            continue
        version = health.get("version") if isinstance(health, dict) else None
        if isinstance(version, int) and not isinstance(version, bool):
            versions[url] = version
    return versions


class JsonHttp:
    """JSON calls to one server: paths are relative to ``base_url``."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s

    def get(self, path: str) -> Any:
        return get_json(self.base_url + path, self.timeout_s, self.api_key)

    def post(self, path: str, body: Any, timeout_s: float | None = None) -> Any:
        url = self.base_url + path
        with _answer(url, body, self.api_key, timeout_s or self.timeout_s) as resp:
            return _decode(resp.read(), url)

    def post_lines(self, path: str, body: Any, timeout_s: float | None = None) -> Iterator[Any]:
        """POST and yield each NDJSON line of the answer as it arrives."""
        url = self.base_url + path
        with _answer(url, body, self.api_key, timeout_s or self.timeout_s) as resp:
            for line in resp:
                if line.strip():
                    yield _decode(line, url)


# -- asynchronous ------------------------------------------------------------------------------
# The scoring path moves ~100k token ids a request: orjson encodes and decodes them ~10x faster than json.
_JSON = {"Content-Type": "application/json"}


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # NaN/Infinity: read them, so the caller's checks name them (never a number)
        return json.loads(raw)


#: every session :func:`open_session` made, with the event loop it belongs to (closed ones drop out at exit)
_SESSIONS: weakref.WeakKeyDictionary[aiohttp.ClientSession, asyncio.AbstractEventLoop] = weakref.WeakKeyDictionary()


def open_session(api_key: str | None, max_connections: int) -> aiohttp.ClientSession:
    """A pooled session that sends the API key with every request (one per event loop; call it in that loop)."""
    connector = aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=30)
    session = aiohttp.ClientSession(connector=connector, headers=auth_headers(api_key))
    _SESSIONS[session] = asyncio.get_running_loop()
    return session


@atexit.register
def close_open_sessions() -> int:
    """Close the sessions still open when the process exits; returns how many.

    A script that scores and returns without ``close()`` (the manager's, the client's) would
    otherwise print aiohttp's "Unclosed client session" / "Unclosed connector" errors at exit.
    A session whose loop has ended (``asyncio.run`` closes its loop) is closed on a loop of its
    own: its connections died with its loop, so closing only marks it closed.
    """
    closed = 0
    for session, loop in list(_SESSIONS.items()):
        if session.closed or loop.is_running():  # a loop running in another thread closes its own
            continue
        if loop.is_closed():
            spare = asyncio.new_event_loop()
            try:
                spare.run_until_complete(session.close())
            finally:
                spare.close()
        else:
            loop.run_until_complete(session.close())
        closed += 1
    return closed


async def request_json(
    session: aiohttp.ClientSession, method: str, url: str, payload: Any = None, *,
    total_s: float, connect_s: float, read_s: float,
) -> Any:
    """One attempt, no retry: the decoded answer, or :class:`HttpError`."""
    timeout = aiohttp.ClientTimeout(total=total_s, sock_connect=connect_s, sock_read=read_s)
    try:
        body = None if payload is None else orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as e:  # e.g. a lone surrogate in a text, a non-JSON type: no retry can help
        raise TypeError(f"{method} {url}: the request body cannot be written as JSON: {e}") from None
    try:
        async with session.request(method, url, data=body, headers=_JSON if body is not None else None,
                                   timeout=timeout) as resp:
            raw = await resp.read()
            status = resp.status
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as e:
        raise HttpError(url, f"connection failed: {type(e).__name__}: {e}", unreachable=True) from None
    except asyncio.TimeoutError as e:  # aiohttp's connect and read timeouts are subclasses: name the one that fired
        which = ("connecting" if isinstance(e, aiohttp.ConnectionTimeoutError) else
                 "reading" if isinstance(e, aiohttp.SocketTimeoutError) else "on the attempt's total")
        raise HttpError(url, f"timed out {which} (limits: total {total_s:.3g}s, connect {connect_s:.3g}s, "
                             f"read {read_s:.3g}s)") from None
    except aiohttp.ClientError as e:
        raise HttpError(url, f"{type(e).__name__}: {e}") from None
    if status >= 400:
        raise HttpError(url, error_message(raw), status)
    return _decode(raw, url, _loads)


#: the lowest port :func:`free_port` hands out: above Ray's worker ports (its default 10002-19999), which Ray's
#: workers bind as they start
LISTEN_PORTS_LOW = 20000


def ephemeral_range_start() -> int:
    """The first port the kernel hands out as an outgoing connection's source (Linux's default 32768, or the
    node's own ``ip_local_port_range``)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A port free on ``host`` ("" = every interface) for the caller to listen on later (a server it starts, a
    process group's store), below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` is in the ephemeral range, and between its release here and the
    caller's own bind any outgoing connection on the node may be given it as its source port, or another
    process's ``bind(0)`` may get it (a reward server's start failed so, EADDRINUSE, while another server started
    and the other tests' HTTP traffic ran). Ports below that range are never handed out so; a random one of
    them is taken, so two callers at once rarely pick the same. Where the range starts too low to leave room, the
    kernel's choice is taken."""
    high = ephemeral_range_start()
    candidates = (rng or random).sample(range(LISTEN_PORTS_LOW, high), min(64, max(high - LISTEN_PORTS_LOW, 0)))
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:  # taken: the next one
                continue
            return port
    with socket.socket() as s:  # the kernel's choice (or the host's own error)
        s.bind((host, 0))
        return s.getsockname()[1]
