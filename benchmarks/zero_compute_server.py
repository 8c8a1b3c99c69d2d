"""BENCHMARK FIXTURE: an endpoint that speaks ``POST /score`` and answers without model compute.

It exists only to measure the ceiling of the trainer side (the manager's samples/s when
the server costs nothing); no test uses it to check correctness. It reads the request's
``input`` (all token-id lists or all texts, as the protocol says) with orjson rather than
the real server's strict parser, so that its own time stays small next to what is
measured; it answers with ``protocol.score.score_response`` (score = number of tokens /
1000, deterministic) and serves ``/health`` with a ``max_model_len`` like the real
server. It runs in its own process, so it never competes with the measured side for the GIL.

    with zero_compute_server() as url: ...
"""

from __future__ import annotations

import multiprocessing
import time
from contextlib import contextmanager
from typing import Iterator

MODEL = "zero-compute"
MAX_MODEL_LEN = 4096


def _serve(port: int) -> None:
    import orjson
    from aiohttp import web

    from verl_vllm_rm.protocol.errors import error_body
    from verl_vllm_rm.protocol.score import score_response

    async def score(request: web.Request) -> web.Response:
        items = orjson.loads(await request.read()).get("input")
        if not items or not (all(isinstance(x, str) for x in items) or all(isinstance(x, list) for x in items)):
            return web.json_response(error_body("'input' must be a non-empty list of texts or token-id lists", 400),
                                     status=400)
        body = score_response(MODEL, [len(x) / 1000 for x in items], sum(map(len, items)))
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": MODEL, "max_model_len": MAX_MODEL_LEN})

    app = web.Application(client_max_size=1 << 30)
    app.add_routes([web.post("/score", score), web.get("/health", health)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@contextmanager
def zero_compute_server() -> Iterator[str]:
    """The fixture's base URL, served from a child process for the duration of the block."""
    from verl_vllm_rm.client.http import HttpError, free_port, get_json

    port = free_port()
    proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    proc.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                get_json(url + "/health", timeout_s=1)
                break
            except HttpError:
                if time.monotonic() > deadline or not proc.is_alive():
                    raise RuntimeError("the zero-compute /score fixture did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.join(10)
