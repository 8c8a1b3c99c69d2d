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
import time
import urllib.parse
import uuid
import weakref
from typing import Any, Iterator, Mapping, Sequence

import torch

from verl_vllm_rm.client.http import HttpError, JsonHttp, free_port
from verl_vllm_rm.protocol.inventory import ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.wire import Bucket, BufferPool, TransferGroup, open_group, pack
from verl_vllm_rm.weight_sync.outgoing import Outgoing


class WeightSyncError(RuntimeError):
    """A transfer that was accepted but did not complete; the server keeps its old weights."""


def is_refusal(error: HttpError) -> bool:
    """A 4xx: the server refused the request before anything changed (a :class:`WeightUpdateRefused`)."""
    return error.status is not None and error.status < 500


def local_address_towards(url: str) -> str:
    """The address the server can reach this trainer at (the interface that routes to it)."""
    host = urllib.parse.urlparse(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


BUSY_RETRY_S = (0.2, 2.0)  # the first and the longest pause between asks of a busy server
#: how much longer than the publisher's ``timeout_s`` a call to the server is waited for: the server answers within
#: its own bounds (``/init_communicator`` within the request's ``timeout_s`` + 1 s, server/weights/join.py), so
#: what is left is the answer's way back on a loaded machine. A frozen server is given up after timeout_s + this.
ANSWER_GRACE_S = 10.0


class TransferSession:
    """One trainer rank's side of the tensor plane with one server (connected on rank 0 only).

    ``stall_timeout_s``: the server's ``--weight-update-stall-timeout``. Each wait of a transfer (one bucket) lasts
    at most it (or ``timeout_s`` when shorter), as the server's own do; a server busy with another trainer's update
    (one that died mid-transfer, or staged and never committed) is asked again for twice that bound, within which
    the server frees itself."""

    def __init__(self, http: JsonHttp, transport: str, server_world_size: int, *, master_address: str,
                 timeout_s: float, bucket_bytes: int, stall_timeout_s: float) -> None:
        self.http = http
        self.transport = transport
        self.server_world_size = server_world_size
        self.master_address = master_address
        self.timeout_s = timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.bucket_bytes = bucket_bytes
        self._group: TransferGroup | None = None
        self._buffers: BufferPool | None = None
        # This rank's device, read here on the caller's thread: the group is built on a thread of its own, whose
        # current CUDA device would be 0 whatever device this rank uses.
        self.device = torch.device("cuda", torch.cuda.current_device()) if transport == "nccl" else None

    @property
    def connected(self) -> bool:
        return self._group is not None

    def connect(self) -> None:
        """Host a store, ask the server to join, build the group (no-op when connected)."""
        if self._group is not None:
            return
        port, session = free_port(""), uuid.uuid4().hex
        result: dict[str, Any] = {}
        busy_s = 2 * self.stall_timeout_s

        def join() -> None:
            try:
                result["group"] = open_group(
                    self.transport, self.master_address, port, 0, 1 + self.server_world_size,
                    min(self.timeout_s, self.stall_timeout_s), session, join_timeout_s=self.timeout_s + busy_s,
                    device=self.device,
                )
            except Exception as e:  # surfaced below, after the server's answer
                result["error"] = e

        thread = threading.Thread(target=join, daemon=True, name="rm-weight-sync-connect")
        thread.start()
        body = {"master_address": self.master_address, "master_port": port, "session": session,
                "timeout_s": self.timeout_s}
        try:
            self._ask_to_join(body, time.monotonic() + busy_s)
        except HttpError as e:
            if is_refusal(e):
                raise WeightUpdateRefused(e.message) from None
            raise WeightSyncError(
                f"the server did not join this trainer's transfer group at {self.master_address}:{port}: {e.message}"
                " (is that address reachable from the server? set the publisher's master_address)") from None
        thread.join(self.timeout_s + ANSWER_GRACE_S)
        if "group" not in result:
            # internal: the server answers ok only once all ranks joined one rendezvous, this one's open_group included
            raise WeightSyncError(f"could not open the transfer group: {result.get('error', 'timed out')}")
        self._group = result["group"]

    def _ask_to_join(self, body: dict[str, Any], busy_until: float) -> None:
        """``/init_communicator``; a 409 (the server is busy with another session's update) is asked again until
        ``busy_until``, then raised saying how long the server stayed busy."""
        pause = BUSY_RETRY_S[0]
        while True:
            try:
                self.http.post("/init_communicator", body, timeout_s=self.timeout_s + ANSWER_GRACE_S)
                return
            except HttpError as e:
                if e.status != 409:
                    raise
                if time.monotonic() + pause > busy_until:
                    raise WeightUpdateRefused(
                        f"{self.http.base_url} stayed busy with another trainer's update for "
                        f"{2 * self.stall_timeout_s:g} s, twice its --weight-update-stall-timeout "
                        f"({self.stall_timeout_s:g} s): {e.message}") from None
            time.sleep(pause)
            pause = min(2 * pause, BUSY_RETRY_S[1])

    def drop(self) -> None:
        """Forget a group a failed transfer broke (the server closed its side); the next update rejoins."""
        self._group = None

    def close(self) -> None:
        if self._group is not None:
            self._group = None
            self.http.post("/close_communicator", {})

    def announce(self, specs: Sequence[ParamSpec], mode: RewardModelTrainingMode,
                 version: int, commit: str = "now",
                 lora_scaling: Mapping[str, float] | None = None) -> Iterator[dict[str, Any]]:
        """Connect if needed and send the metadata (``commit``: ``now``, or ``deferred`` to stage it); once
        accepted, the answer's remaining lines. ``lora_scaling``: the adapters' scalings, when adapters travel.

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
        if lora_scaling:
            body["lora"] = {"scaling": dict(lora_scaling)}
        for may_rejoin in (True, False):
            lines = self.http.post_lines("/update_param_batch", body, timeout_s=self.timeout_s + ANSWER_GRACE_S)
            try:
                first = next(lines)
            except HttpError as e:
                if may_rejoin and e.status == 409 and "no communicator" in e.message:
                    self.drop()  # the server dropped the session (an earlier failure): rejoin
                    self.connect()
                    continue
                raise (WeightUpdateRefused(e.message) if is_refusal(e) else e) from None
            if first.get("status") != "accepted":
                # internal: a peer out of protocol (our server's first line of an accepted update is "accepted")
                raise WeightSyncError(f"unexpected answer from the server: {first}")
            return lines
        raise AssertionError("unreachable")

    def stream(self, items: Sequence[Outgoing], buckets: Sequence[Bucket]) -> int:
        """Gather (every rank), pack and broadcast (if connected): bucket i is packed while i-1 is on the wire.

        A bucket's gathered tensors are dropped once packed, so a rank holds at most one bucket of gathered
        (full, or merged) tensors at a time, never the whole model. Returns the most gathered bytes held at
        once, counted by the tensors' own lifetimes (a reference kept too long shows up here).
        """
        by_name = {item.spec.name: item for item in items}
        in_flight: list = [None, None]
        live = _LiveBytes()
        for i, bucket in enumerate(buckets):
            tensors = [live.track(item.produce(), item.gathers) for item in (by_name[s.spec.name] for s in bucket.slots)]
            if self._group is not None:
                self._wait(in_flight, i - 2, len(buckets))
                if self._buffers is None or self._buffers.device != self._group.device:
                    self._buffers = BufferPool(self._group.device)
                buffer = pack(bucket, tensors, self._buffers.get(i % 2, bucket.nbytes))
                in_flight[i % 2] = self._group.broadcast(buffer)
            del tensors
        for i in (len(buckets) - 2, len(buckets) - 1):
            self._wait(in_flight, i, len(buckets))
        return live.peak

    def _wait(self, in_flight: list, i: int, n: int) -> None:
        """Wait for bucket ``i``'s broadcast, if it is in flight: at most the group's timeout (a stall)."""
        if i >= 0 and in_flight[i % 2] is not None:
            work, in_flight[i % 2] = in_flight[i % 2], None
            self._group.wait(work, f"sending bucket {i + 1} of {n} to {self.http.base_url} (the shorter of its "
                                   f"--weight-update-stall-timeout {self.stall_timeout_s:g} s and the publisher's "
                                   f"timeout_s {self.timeout_s:g} s)")


class _LiveBytes:
    """Bytes of the tracked tensors still alive, and the most at once (``weakref.finalize`` on each)."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def track(self, tensor: torch.Tensor, new: bool) -> torch.Tensor:
        """Count ``tensor`` while it lives when it is ``new`` (made by the publish, not the model's own)."""
        if not new:
            return tensor
        size = tensor.numel() * tensor.element_size()
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(tensor, self._free, size)
        return tensor

    def _free(self, size: int) -> None:
        self.now -= size
