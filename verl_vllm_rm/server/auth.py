"""API-key guard for every route but the liveness probes.

vLLM's own ``--api-key`` middleware guards only ``/v1``-style prefixes, which
leaves ``/score``, ``/classify`` and ``/pooling`` open; this guard closes them.
"""

from __future__ import annotations

import hashlib
import secrets

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from verl_vllm_rm.server.state import error_response

OPEN_PATHS = frozenset({"/health", "/ping"})
_TOKEN_HASHES: list[bytes] = []


def enable(tokens: list[str]) -> str:
    """Set the accepted keys; returns the dotted path to pass in vLLM's ``args.middleware``."""
    _TOKEN_HASHES[:] = [hashlib.sha256(t.encode()).digest() for t in tokens]
    return f"{__name__}.RequireApiKey"


class RequireApiKey:
    """Installed through vLLM's own ``--middleware`` seam, which takes a class, not arguments."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.hashes = list(_TOKEN_HASHES)

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        return any([secrets.compare_digest(digest, h) for h in self.hashes])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path not in OPEN_PATHS and not self._authorized(Headers(scope=scope)):
            message = "missing or wrong API key: send 'Authorization: Bearer <key>' (the server's --api-key)"
            return await error_response(message, 401)(scope, receive, send)
        return await self.app(scope, receive, send)
