"""Helpers for tests that look at a server's processes from outside (plain functions)."""

from __future__ import annotations

import psutil


def listening_ip(pid: int, port: int) -> str | None:
    """The address the process ``pid`` (or one of its children) listens on at ``port``; None if none does."""
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        for conn in proc.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                return conn.laddr.ip
    return None
