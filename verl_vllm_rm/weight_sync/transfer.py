"""Running a publish's transfer: the session with the server's workers, the metadata, the buckets.

Rank 0 hosts a ``TCPStore`` on a free port and asks the server to join
(``/init_communicator``); each update is announced over HTTP
(``/update_param_batch``, answered in NDJSON: a refusal, or ``accepted`` then the
outcome) and its buckets are broadcast over the private process group. Every
other rank holds a session that never connects and only gathers its shards.
"""

from __future__ import annotations

import socket
import threading
import urllib.parse
import uuid
from typing import Any, Iterator, Sequence

from verl_vllm_rm.client.http import HttpError, JsonHttp, free_port
from verl_vllm_rm.protocol.inventory import ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.wire import Bucket, BufferPool, TransferGroup, open_group, pack
from verl_vllm_rm.weight_sync.selection import Outgoing


class WeightSyncError(RuntimeError):
    """A transfer that was accepted but did not complete; the server keeps its old weights."""


def local_address_towards(url: str) -> str:
    """The address the server can reach this trainer at (the interface that routes to it)."""
    host = urllib.parse.urlparse(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


class TransferSession:
    """One trainer rank's side of the tensor plane with one server (connected on rank 0 only)."""

    def __init__(self, http: JsonHttp, transport: str, server_world_size: int, *, master_address: str,
                 timeout_s: float, bucket_bytes: int) -> None:
        self.http = http
        self.transport = transport
        self.server_world_size = server_world_size
        self.master_address = master_address
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        self._group: TransferGroup | None = None
        self._buffers: BufferPool | None = None

    @property
    def connected(self) -> bool:
        return self._group is not None

    def connect(self) -> None:
        """Host a store, ask the server to join, build the group (no-op when connected)."""
        if self._group is not None:
            return
        port, session = free_port(""), uuid.uuid4().hex
        result: dict[str, Any] = {}

        def join() -> None:
            try:
                result["group"] = open_group(
                    self.transport, self.master_address, port, 0, 1 + self.server_world_size, self.timeout_s, session
                )
            except Exception as e:  # surfaced below, after the server's answer
                result["error"] = e

        thread = threading.Thread(target=join, daemon=True, name="rm-weight-sync-connect")
        thread.start()
        body = {"master_address": self.master_address, "master_port": port, "session": session,
                "timeout_s": self.timeout_s}
        self.http.post("/init_communicator", body, timeout_s=self.timeout_s + 30)
        thread.join(self.timeout_s + 30)
        if "group" not in result:
            raise WeightSyncError(f"could not open the transfer group: {result.get('error', 'timed out')}")
        self._group = result["group"]

    def drop(self) -> None:
        """Forget a group a failed transfer broke (the server closed its side); the next update rejoins."""
        self._group = None

    def close(self) -> None:
        if self._group is not None:
            self._group = None
            self.http.post("/close_communicator", {})

    def announce(self, specs: Sequence[ParamSpec], mode: RewardModelTrainingMode,
                 version: int, commit: str = "now") -> Iterator[dict[str, Any]]:
        """Connect if needed and send the metadata (``commit``: ``now``, or ``deferred`` to stage it); once
        accepted, the answer's remaining lines.

        Raises :class:`WeightUpdateRefused` for a 4xx (nothing was sent), else the error that stopped it.
        """
        self.connect()
        body = {
            "metadata": [s.to_json() for s in specs],
            "training_mode": mode.value,
            "version": version,
            "bucket_bytes": self.bucket_bytes,
            "commit": commit,
        }
        for may_rejoin in (True, False):
            lines = self.http.post_lines("/update_param_batch", body, timeout_s=self.timeout_s + 30)
            try:
                first = next(lines)
            except HttpError as e:
                if may_rejoin and e.status == 409 and "no communicator" in e.message:
                    self.drop()  # the server dropped the session (an earlier failure): rejoin
                    self.connect()
                    continue
                raise (WeightUpdateRefused(e.message) if e.status is not None and e.status < 500 else e) from None
            if first.get("status") != "accepted":
                raise WeightSyncError(f"unexpected answer from the server: {first}")
            return lines
        raise AssertionError("unreachable")

    def stream(self, items: Sequence[Outgoing], buckets: Sequence[Bucket]) -> None:
        """Gather (every rank), pack and broadcast (if connected): bucket i is packed while i-1 is on the wire."""
        by_name = {item.spec.name: item for item in items}
        in_flight: list = [None, None]
        for i, bucket in enumerate(buckets):
            tensors = [by_name[slot.spec.name].produce() for slot in bucket.slots]
            if self._group is None:
                continue
            if in_flight[i % 2] is not None:
                in_flight[i % 2].wait()
            if self._buffers is None or self._buffers.device != self._group.device:
                self._buffers = BufferPool(self._group.device)
            buffer = pack(bucket, tensors, self._buffers.get(i % 2, bucket.nbytes))
            in_flight[i % 2] = self._group.broadcast(buffer)
        for work in in_flight:
            if work is not None:
                work.wait()
