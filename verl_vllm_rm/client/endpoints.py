"""The reward client's view of each server it routes over, and which of them a request may go to.

Pure data and functions over it (no I/O): :class:`~verl_vllm_rm.client.reward_client.VLLMRewardClient` updates an
:class:`Endpoint` per server as its requests and ``/health`` checks go, and asks :func:`on_newest_version` which
servers a request may go to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass
class Endpoint:
    """The client's view of one server: what it sent there, and whether and on which version it serves."""

    url: str
    outstanding: int = 0
    down_until: float = 0.0
    hung: bool = False  # found hung: back in routing only once its /health answers
    version: int | None = None  # its weight version, as its last /score answer or /health said
    version_read: float = -math.inf  # when that was
    requests: int = 0  # attempts sent to this server, failures among them, and their summed time
    failures: int = 0
    busy_s: float = 0.0
    failovers: int = 0  # requests that failed here and went on to another server
    hangs: int = 0  # attempts abandoned because the server did not answer /health in time


def on_newest_version(endpoints: Sequence[Endpoint], newest_since: float, now: float,
                      recheck_s: float) -> tuple[list[Endpoint], list[Endpoint]]:
    """Of the servers up, ``(routable, to_check)``: those on the newest version any of them is known to serve, or
    whose version is not known yet (none of its answers said), and those known on an older one whose ``/health`` is
    due: read before ``newest_since`` (when a server was first seen on the newest version) or over ``recheck_s``
    ago. The others are behind: no request until a check shows the newest version."""
    newest = max((e.version for e in endpoints if e.version is not None), default=None)
    routable, to_check = [], []
    for e in endpoints:
        if e.version is None or e.version == newest:
            routable.append(e)
        elif e.version_read < newest_since or now - e.version_read >= recheck_s:
            to_check.append(e)
    return routable, to_check


def endpoint_stats(e: Endpoint, now: float) -> dict[str, float]:
    """One server's figures (:meth:`~verl_vllm_rm.client.reward_client.VLLMRewardClient.endpoint_stats`)."""
    return {"requests": e.requests, "outstanding": e.outstanding, "failures": e.failures, "failovers": e.failovers,
            "hangs": e.hangs, "latency_ms": 1000.0 * e.busy_s / e.requests if e.requests else 0.0,
            "cooldown_left_s": max(0.0, e.down_until - now)}
