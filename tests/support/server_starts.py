"""Reward servers started side by side: a start is mostly three processes importing vLLM one after the other, so
two starts together take less than two in a row. A start that fails stops the ones that did not, and raises."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from verl_vllm_rm.replicas.launcher import RewardServer, start_server


@contextmanager
def servers_started_together(starts: Sequence[tuple[str | Path, Sequence[str]]]) -> Iterator[list[RewardServer]]:
    """One server per ``(model, server args)``, all started at once; stopped when the block ends."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [pool.submit(start_server, model, list(args)) for model, args in starts]
    failed = [f.exception() for f in futures if f.exception() is not None]
    servers = [f.result() for f in futures if f.exception() is None]
    try:
        if failed:
            raise failed[0]
        yield servers
    finally:
        for server in servers:
            server.stop()
