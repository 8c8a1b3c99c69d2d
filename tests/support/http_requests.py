"""One raw HTTP request through ``verl_vllm_rm.client.http``, as the HTTP layer's tests send it."""

from __future__ import annotations

import asyncio

from verl_vllm_rm.client.http import open_session, request_json


def request_once(url: str, method: str = "GET", payload=None, api_key: str | None = None):
    async def once():
        async with open_session(api_key, max_connections=2) as session:
            return await request_json(session, method, url, payload, total_s=30.0, connect_s=5.0, read_s=30.0)

    return asyncio.run(once())
