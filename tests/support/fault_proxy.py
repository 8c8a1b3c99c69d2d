"""A loopback HTTP proxy in front of the real server that injects faults.

The only fake in the suite, and it fakes nothing about scoring: it forwards to
the real vLLM server and then delays, drops, fails or corrupts what passes
through (or rewrites its JSON answer on a path, or each line of a streamed one), so client error handling is
tested against real traffic. A test may also hold a request until an event, or act between two answers (publish new
weights exactly there).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp
from aiohttp import web


@dataclass
class Faults:
    fail_status: int = 0  # answer this HTTP status instead of forwarding ...
    fail_times: int = 0  # ... for this many requests
    delay_s: float = 0.0  # sleep before answering
    corrupt: str | None = None  # "nan", "count", "nonjson" (half a body), "index", "truncated" (cut mid-body)
    corrupt_times: int | None = None  # corrupt this many /score (or judge) answers (None: all of them)
    drop: bool = False  # close the connection without answering
    hang: bool = False  # never answer, /health included (a stopped server: port open, nobody home) until stop()
    delay_path: str | None = None  # delay_s only for this path (None: every path)
    rewrite: dict[str, Callable[[Any], Any]] = field(default_factory=dict)  # path -> new JSON answer from the real one
    # path -> each line of a streamed NDJSON answer (/update_param_batch), rewritten as it passes
    rewrite_lines: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    # awaited with a request's record before it is forwarded (on the proxy's event loop): holds it until an event
    hold: Callable[[dict], Awaitable[None]] | None = None
    # called with a request's record (its "answer" included) before that answer goes back: an event the test
    # places between two answers, such as a publish of new weights
    answered: Callable[[dict], None] | None = None


@dataclass
class FaultProxy:
    upstream: str
    faults: Faults = field(default_factory=Faults)
    requests: list[dict] = field(default_factory=list)
    url: str = ""

    def start(self) -> "FaultProxy":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def open_connections(self) -> int:
        """Client connections the proxy holds open now (each request is recorded when it arrives)."""
        return len(self._runner.server.connections)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main(ready))

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = self._runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        async with aiohttp.ClientSession() as self._session:
            ready.set()
            await self._stop.wait()
        await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        record = {"path": request.path, "headers": dict(request.headers), "body": body}
        self.requests.append(record)
        f = self.faults
        if f.hang:
            await self._stop.wait()
            return web.Response(status=503)
        if f.hold is not None:
            await f.hold(record)
        if f.delay_s and f.delay_path in (None, request.path):
            await asyncio.sleep(f.delay_s)
        if f.drop:
            request.transport.close()
            return web.Response(status=500)
        if f.fail_times > 0:
            f.fail_times -= 1
            return web.json_response({"error": {"message": "injected"}}, status=f.fail_status)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        if request.path in f.rewrite_lines:
            return await self._stream_lines(request, body, headers, f.rewrite_lines[request.path], record)
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body,
                                         headers=headers) as up:
            status, text = up.status, await up.text()
        record["answer"] = text  # what the upstream said (before any corruption)
        if f.answered is not None:
            f.answered(record)
        if request.path in f.rewrite and status == 200:
            return web.json_response(f.rewrite[request.path](json.loads(text)))
        if f.corrupt and request.path in ("/score", "/v1/chat/completions") and status == 200 and f.corrupt_times != 0:
            if f.corrupt_times is not None:
                f.corrupt_times -= 1
            if f.corrupt == "truncated":
                return await _truncated(request, text.encode())
            text = _corrupt(text, f.corrupt)
        return web.Response(status=status, text=text, content_type="application/json")


    async def _stream_lines(self, request: web.Request, body: bytes, headers: dict, rewrite: Callable[[Any], Any],
                            record: dict) -> web.StreamResponse:
        """Pass a streamed NDJSON answer through line by line (the trainer acts on its first line before the
        last exists), each line rewritten; what the upstream said is recorded as it was."""
        async with self._session.request(request.method, self.upstream + request.path_qs, data=body,
                                         headers=headers) as up:
            if up.status != 200:
                record["answer"] = await up.text()
                return web.Response(status=up.status, text=record["answer"], content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": up.headers.get("Content-Type", "application/json")})
            await resp.prepare(request)
            record["answer"] = ""
            async for line in up.content:
                record["answer"] += line.decode()
                if line.strip():
                    await resp.write((json.dumps(rewrite(json.loads(line))) + "\n").encode())
            await resp.write_eof()
            return resp


async def _truncated(request: web.Request, body: bytes) -> web.StreamResponse:
    """Announce the whole body, send half of it, then cut the connection (a server dying mid-answer)."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": str(len(body))})
    await resp.prepare(request)
    await resp.write(body[: len(body) // 2])
    request.transport.close()
    return resp


def _corrupt(text: str, kind: str) -> str:
    if kind == "nonjson":
        return text[: len(text) // 2]
    body = json.loads(text)
    if kind == "nan":
        body["data"][0]["score"] = float("nan")
        return json.dumps(body)  # json.dumps writes NaN, as a careless server would
    if kind == "count":
        body["data"] = body["data"][:-1]
    if kind == "index":
        body["data"][0]["index"] = body["data"][-1]["index"]
    return json.dumps(body)
