"""The API-key guard (``server.auth``) in process, as vLLM's app runs it (an ASGI middleware): every route but the
liveness probes needs ``Authorization: Bearer <key>``, answered 401 in the server's error body otherwise."""

from __future__ import annotations

import asyncio
import json

import pytest

from verl_vllm_rm.server import auth

MESSAGE = "missing or wrong API key: send 'Authorization: Bearer <key>' (the server's --api-key)"


async def app(scope, receive, send):
    """The app behind the guard: answers 200 with the path it was asked for."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": scope["path"].encode()})


def call(guard, path: str, headers: dict[str, str] | None = None, **scope) -> tuple[int, bytes]:
    """One request through ``guard``: its status and body."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    full = {"type": "http", "method": "POST", "path": path, "root_path": "", "query_string": b"",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()], **scope}
    asyncio.run(guard(full, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture()
def guard():
    """The middleware vLLM builds from the dotted path ``enable`` returns, over two keys."""
    path = auth.enable(["key-one", "key-two"])
    assert path == "verl_vllm_rm.server.auth.RequireApiKey"
    yield auth.RequireApiKey(app)
    auth.enable([])


@pytest.mark.parametrize("header", ["Bearer key-one", "Bearer key-two", "bearer key-one", "BEARER key-two"])
def test_a_request_with_one_of_the_keys_passes(guard, header):
    assert call(guard, "/score", {"Authorization": header}) == (200, b"/score")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer key-three"}, {"Authorization": "key-one"},
                                     {"Authorization": "Basic key-one"}, {"Authorization": "Bearer "},
                                     {"X-Api-Key": "key-one"}],
                         ids=["none", "wrong key", "no scheme", "basic", "empty key", "other header"])
def test_a_request_without_a_right_key_is_answered_401_naming_the_fix(guard, headers):
    status, body = call(guard, "/weight_inventory", headers)
    assert status == 401
    assert json.loads(body) == {"error": {"message": MESSAGE, "type": "AuthenticationError", "code": 401}}


def test_liveness_probes_and_preflights_pass_without_a_key(guard):
    assert call(guard, "/health") == (200, b"/health")
    assert call(guard, "/ping") == (200, b"/ping")
    assert call(guard, "/api/health", root_path="/api") == (200, b"/api/health")  # behind a proxy's prefix
    assert call(guard, "/score", method="OPTIONS") == (200, b"/score")
    assert call(guard, "/health/x")[0] == 401 and call(guard, "/api/score", root_path="/api")[0] == 401


def test_the_keys_are_those_set_when_the_guard_was_built():
    auth.enable(["old"])
    guard = auth.RequireApiKey(app)
    auth.enable(["new"])
    try:
        assert call(guard, "/score", {"Authorization": "Bearer old"})[0] == 200
        assert call(guard, "/score", {"Authorization": "Bearer new"})[0] == 401
        assert call(auth.RequireApiKey(app), "/score", {"Authorization": "Bearer new"})[0] == 200
    finally:
        auth.enable([])
