"""Joining the trainer's process group for weight updates, bounded in time and off the engine's loop.

Two halves of one mechanism. In each worker (:class:`PendingJoin`, started by the worker
extension's ``init_weight_transfer_engine`` phase ``begin``), the join runs on a thread of its
own: it blocks until the trainer's store answers, and torch's ``TCPStore`` client never times
out against a peer that accepts the connection but never speaks (it waits in ``recv`` for the
ping's answer, whatever the timeout). On the server (:func:`join_group`, ``/init_communicator``),
the workers are polled with short engine calls, so scoring goes on meanwhile, and the joined
group is taken (phase ``finish``). A join still under way ``JOIN_GRACE_S`` after its bound is
abandoned on every worker (vLLM's ``shutdown_weight_transfer_engine``): its result is dropped
and the sockets it opened to the trainer's address are shut down, which ends the blocked
``recv`` (and with it the thread) and closes the connection at the peer. No group is left
half-joined, the old weights keep serving, and the next ``/init_communicator`` starts afresh.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

from verl_vllm_rm.protocol.wire import TransferGroup

logger = logging.getLogger(__name__)
JOIN_POLL_S = 0.05
JOIN_GRACE_S = 1.0  # torch's own timeout error, when it comes, is more telling than ours
_FD_DIR = "/proc/self/fd"  # Linux; elsewhere an abandoned join keeps its thread until torch gives up


def _sockets() -> dict[int, str]:
    """This process's socket descriptors and their inode names (``socket:[N]``)."""
    out = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


def _normalized(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


class PendingJoin:
    """``open_fn()`` running on a daemon thread; the group, or its error, once :meth:`done`."""

    def __init__(self, open_fn: Callable[[], TransferGroup], address: str, port: int) -> None:
        self.address, self.port = address, port
        self._before = set(_sockets().values())
        self._peers: set[str] | None = None
        self._abandoned = False
        self._group: TransferGroup | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(open_fn,), daemon=True, name="rm-weight-join")
        self._thread.start()

    def _run(self, open_fn: Callable[[], TransferGroup]) -> None:
        try:
            infos = socket.getaddrinfo(self.address, self.port, type=socket.SOCK_STREAM)
            self._peers = {_normalized(info[4][0]) for info in infos}
            group = open_fn()
        except BaseException as e:  # handed to result()
            self._error = e
            return
        if not self._abandoned:
            self._group = group

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> TransferGroup:
        """The joined group; raises the join's error. Call once :meth:`done`."""
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"{type(self._error).__name__}: {self._error}") from self._error
        if self._group is None:
            # internal: finish_join reads the result only of a join it has not abandoned (shutdown drops it unread)
            raise RuntimeError("the join was abandoned")
        return self._group

    def abandon(self) -> int:
        """Drop the join; shut down the sockets it opened to the trainer. Returns how many were shut down."""
        self._abandoned, self._group = True, None
        if self.done() or self._peers is None:
            return 0
        closed = 0
        for fd, inode in _sockets().items():
            if inode in self._before:
                continue
            try:
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                peer = sock.getpeername()
                if isinstance(peer, tuple) and peer[1] == self.port and _normalized(peer[0]) in self._peers:
                    sock.shutdown(socket.SHUT_RDWR)  # the shared socket: the blocked recv returns, torch raises
                    closed += 1
            except OSError:
                pass
            finally:
                sock.close()  # our duplicate only
        return closed


class JoinTimedOut(Exception):
    pass


def join_bound(requested_s: float, cap_s: float) -> float:
    """A request's ``timeout_s`` may shorten the server's ``--weight-update-join-timeout``, never lengthen it."""
    return min(requested_s, cap_s)


async def join_group(engine, info: dict[str, Any], bound_s: float) -> None:
    """Join every worker to the trainer's group within ``bound_s`` (+ grace), or raise and leave none joined."""
    init = {**info, "join_timeout_s": bound_s}
    deadline = time.monotonic() + bound_s + JOIN_GRACE_S
    try:
        await engine.init_weight_transfer_engine(WeightTransferInitRequest({**init, "phase": "begin"}))
        while not all(await engine.collective_rpc("rm_join_done")):
            if time.monotonic() >= deadline:
                raise JoinTimedOut(
                    f"the trainer's store at {info['master_address']}:{info['master_port']} did not complete the "
                    f"join within {bound_s:g} s (min of the request's timeout_s and --weight-update-join-timeout)"
                )
            await asyncio.sleep(JOIN_POLL_S)
        await engine.init_weight_transfer_engine(WeightTransferInitRequest({**init, "phase": "finish"}))
    except BaseException:
        try:  # abandon: no worker is left half-joined
            await asyncio.shield(engine.shutdown_weight_transfer_engine())
        except Exception:
            logger.exception("could not abandon a failed join")
        raise
