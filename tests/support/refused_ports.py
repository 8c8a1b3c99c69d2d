"""Loopback URLs with nothing listening: each port is bound and never listens, so a connection is refused at once,
and no server another test (or another xdist worker) starts can take the port while it is held."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager


@contextmanager
def refused_urls(n: int) -> Iterator[list[str]]:
    """``n`` such URLs, held until the block ends."""
    with ExitStack() as stack:
        held = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in held:
            sock.bind(("127.0.0.1", 0))
        yield [f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in held]
