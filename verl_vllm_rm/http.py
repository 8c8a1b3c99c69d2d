"""A small synchronous JSON client for the weight-update metadata plane.

Synchronous on purpose: a publish runs inside a training step (no event loop),
and its HTTP calls are few and small. Every call has a finite timeout; a server
error becomes :class:`ServerError` carrying the server's own message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Iterator


class ServerError(RuntimeError):
    def __init__(self, status: int, message: str, url: str):
        super().__init__(f"{url} answered {status}: {message}")
        self.status = status
        self.message = message


class JsonHttp:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def _open(self, path: str, body: dict[str, Any] | None, timeout_s: float | None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, headers=self.headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout_s or self.timeout_s)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace")
            raise ServerError(e.code, message, self.base_url + path) from None

    def get(self, path: str) -> dict[str, Any]:
        with self._open(path, None, None) as resp:
            return json.loads(resp.read())

    def post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        with self._open(path, body, timeout_s) as resp:
            return json.loads(resp.read())

    def post_lines(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> Iterator[dict[str, Any]]:
        """POST and yield each NDJSON line of the answer as it arrives."""
        with self._open(path, body, timeout_s) as resp:
            for line in resp:
                if line.strip():
                    yield json.loads(line)
