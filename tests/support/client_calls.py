"""The reward client tests' shared settings: fast back-off, and running a client's coroutine to its end."""

from __future__ import annotations

import asyncio

FAST = dict(backoff_base_s=0.01, backoff_max_s=0.05)


def run(client, coro):
    async def main():
        try:
            return await coro
        finally:
            await client.close()

    return asyncio.run(main())
