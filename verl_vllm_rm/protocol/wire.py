"""The tensor plane: a private process group and the bucket layout both sides derive.

The trainer and the server open a two-sided (or 1 + N workers) process group on
a ``TCPStore`` the trainer hosts; ``ProcessGroupGloo``/``ProcessGroupNCCL`` are
built directly on that store, so neither side touches the global
``torch.distributed`` state (a trainer may already run its own default group).

Tensors travel in size-bounded buckets: one flat byte buffer per bucket, one
broadcast per buffer. Both sides compute the same layout from the same metadata
(:func:`plan_buckets`), so only names, dtypes and shapes go over HTTP. Depends on
torch only: the trainer, the server and the benchmark's raw receiver share it.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist

from verl_vllm_rm.protocol.inventory import ParamSpec

ALIGN = 64
DEFAULT_BUCKET_BYTES = 64 << 20
BACKENDS = ("gloo", "nccl")


def nccl_version() -> str | None:
    """This process's NCCL (the one torch loads), as ``"2.29.7"``; ``None`` without CUDA."""
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def transport_mismatch(transport: str, server_nccl: str | None, trainer_nccl: str | None) -> str | None:
    """Why this trainer cannot send over the server's transport, or ``None`` when it can.

    NCCL refuses a peer of another version when the communicator forms, so the versions must be equal; a trainer
    without CUDA has no NCCL at all."""
    if transport != "nccl":
        return None
    if trainer_nccl is None:
        return ("the server receives weights over nccl (GPU) and this trainer has no CUDA: publish from a trainer "
                "on a GPU, or start the server with --weight-update-backend gloo")
    if server_nccl != trainer_nccl:
        return (f"the server's NCCL is {server_nccl} and this trainer's is {trainer_nccl}; NCCL refuses peers of "
                f"another version: install one NCCL in both environments (e.g. pip install --no-deps nvidia-nccl-cu13=="
                f"{server_nccl} in the trainer's, as `make setup DEVICE=gpu` does from requirements/nccl-gpu.txt)")
    return None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        # internal: every spec reaching slot_view passed ParamSpec.from_json or check_update (ALLOWED_DTYPES only)
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


@dataclass(frozen=True)
class Slot:
    spec: ParamSpec
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    slots: tuple[Slot, ...]
    nbytes: int


def plan_buckets(specs: Sequence[ParamSpec], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Split ``specs`` (in the given order) into buckets of at most ``bucket_bytes``.

    A tensor larger than ``bucket_bytes`` travels alone. Offsets are aligned so
    every slot can be viewed in its own dtype without a copy.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be a positive number of bytes, got {bucket_bytes}: give the publisher a "
                         f"bucket size > 0 (default {DEFAULT_BUCKET_BYTES}, 64 MiB)")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    used = 0
    for spec in specs:
        size = spec.nbytes
        offset = -(-used // ALIGN) * ALIGN
        if slots and offset + size > bucket_bytes:
            buckets.append(Bucket(tuple(slots), used))
            slots, offset = [], 0
        slots.append(Slot(spec, offset, size))
        used = offset + size
    if slots:
        buckets.append(Bucket(tuple(slots), used))
    return buckets


def slot_view(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The slot's bytes in ``buffer`` seen as its own dtype and shape (no copy)."""
    raw = buffer[slot.offset : slot.offset + slot.nbytes]
    return raw.view(to_dtype(slot.spec.dtype)).view(slot.spec.shape)


class BufferPool:
    """Byte buffers kept between buckets and between updates.

    A fresh 64 MiB buffer costs its page faults again on every use, which on a
    CPU costs as much as the copy itself; reusing a few buffers pays them once.
    ``pin_memory``: host buffers a CUDA device copies to and from at full speed.
    """

    def __init__(self, device: torch.device, pin_memory: bool = False) -> None:
        self.device = device
        self.pin_memory = pin_memory
        self.buffers: list[torch.Tensor] = []

    def get(self, index: int, nbytes: int) -> torch.Tensor:
        """Buffer ``index`` with at least ``nbytes`` (grown when too small), cut to ``nbytes``."""
        while len(self.buffers) <= index:
            self.buffers.append(torch.empty(0, dtype=torch.uint8, device=self.device))
        if self.buffers[index].numel() < nbytes:
            self.buffers[index] = self.buffers[index].new_empty(0)  # the old one is freed before the new is made
            self.buffers[index] = torch.empty(nbytes, dtype=torch.uint8, device=self.device,
                                              pin_memory=self.pin_memory)
        return self.buffers[index][:nbytes]

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self.buffers)


def pack(bucket: Bucket, tensors: Iterable[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Copy ``tensors`` into the byte buffer ``out``; the copy also casts dtype and moves device."""
    for slot, tensor in zip(bucket.slots, tensors, strict=True):
        slot_view(out, slot).copy_(tensor.detach())
    return out


def unpack(bucket: Bucket, buffer: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    for slot in bucket.slots:
        yield slot.spec.name, slot_view(buffer, slot)


# torch reads these when a ProcessGroupNCCL is constructed (its constructor's getCvarBool): with blocking wait, a
# failed or timed-out collective is aborted and raises from ``wait()``, and no watchdog thread is started, so none
# tears the process down (torch's default, TORCH_NCCL_ASYNC_ERROR_HANDLING=3, kills it after the timeout).
NCCL_RAISES_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1"}
_environment_lock = threading.Lock()


@contextmanager
def _environment(values: dict[str, str]):
    """``values`` in ``os.environ`` for the block only (one block at a time), then the process's own again."""
    with _environment_lock:
        saved = {name: os.environ.get(name) for name in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class TransferStalled(RuntimeError):
    """A wait of a transfer that saw no progress for the group's timeout (the peer stopped sending or receiving)."""


@dataclass
class TransferGroup:
    """A process group private to one trainer<->server session (rank 0 = trainer).

    ``timeout_s``: the most any one wait on it lasts (each bucket is one wait: a wait is a transfer's progress)."""

    store: dist.Store
    group: dist.ProcessGroup
    rank: int
    world_size: int
    device: torch.device
    timeout_s: float

    def broadcast(self, tensor: torch.Tensor, root: int = 0):
        """Start a broadcast; returns the work handle to ``wait()`` on (or to :meth:`wait`)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return self.group.broadcast([tensor], opts)

    def form(self, timeout_s: float) -> None:
        """One warm-up broadcast from rank 0, within ``timeout_s``: every rank's connections exist afterwards."""
        warm_up = torch.zeros(1, dtype=torch.uint8, device=self.device)
        self.wait(self.broadcast(warm_up), f"forming the transfer group (rank {self.rank} of {self.world_size})",
                  timeout_s)

    def wait(self, work, what: str, timeout_s: float | None = None) -> None:
        """``work.wait()`` for at most ``timeout_s`` (default: the group's); a wait that ran out raises
        :class:`TransferStalled` naming ``what`` and the bound, any other failure its own error."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        try:
            work.wait(datetime.timedelta(seconds=bound))
        except RuntimeError as e:
            if time.monotonic() - t0 < 0.9 * bound:
                raise
            raise TransferStalled(f"{what}: no progress for {bound:g} s ({e})") from e


def open_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float,
    session: str,
    join_timeout_s: float | None = None,
    device: torch.device | None = None,
) -> TransferGroup:
    """Join (rank 0: host) the session's store and build the process group on it.

    ``device``: where this rank stages and receives buckets; for NCCL, the CUDA device of the worker or trainer
    rank itself. It is never read from ``torch.cuda.current_device()`` here: joins and receives run on threads of
    their own, and a new thread's current device is 0 whatever its process uses (every tensor-parallel worker
    would then stage on GPU 0, and NCCL fails with "Duplicate GPU detected").

    Blocks until all ``world_size`` ranks have joined, for at most ``join_timeout_s``
    (default ``timeout_s``) on the store and the rendezvous, then forms the group's
    connections with one warm-up broadcast from rank 0 within the same bound (NCCL would
    otherwise connect lazily at the first bucket: a peer that died after the join would
    then be found only by a transfer's wait). Every rank of a group calls this function,
    so every rank takes part in the warm-up. Every collective on the group then fails
    after ``timeout_s`` instead of hanging, which is what lets a server survive a trainer
    that dies mid-transfer: gloo raises from ``wait()``, and an NCCL group is built in
    blocking-wait mode (:data:`NCCL_RAISES_ENV`) so that it raises too, where torch's
    default would kill the process.
    """
    if backend not in BACKENDS:
        # internal: the server takes an argparse choice (gloo/nccl), the trainer that server's /weight_inventory answer
        raise ValueError(f"unknown transport backend {backend!r}; use one of {list(BACKENDS)}")
    if backend == "nccl" and (device is None or device.type != "cuda" or device.index is None):
        raise ValueError(f"the nccl transport needs this rank's own CUDA device (cuda:N), got {device}: pass the "
                         "worker's device, not the current device of a thread")
    timeout = datetime.timedelta(seconds=timeout_s)
    join = datetime.timedelta(seconds=timeout_s if join_timeout_s is None else join_timeout_s)
    store = dist.TCPStore(
        host, port, world_size, is_master=rank == 0, timeout=join, wait_for_workers=False
    )
    prefixed = dist.PrefixStore(f"verl_vllm_rm/{session}", store)
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, join)
        if join != timeout:
            group._set_default_timeout(timeout)
        device = torch.device("cpu")
    else:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout  # NCCL connects lazily, through the store, at the first collective
        with _environment(NCCL_RAISES_ENV):
            group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    if join != timeout:
        store.set_timeout(timeout)
    formed = TransferGroup(store, group, rank, world_size, device, timeout_s)
    formed.form(join.total_seconds())
    return formed
