"""``RewardModelPublisher``: push a trained reward model's weights into the running server.

One publish: normalise the state dict's names to the server's, keep what the
training mode changed (head / merged LoRA modules + head / everything), check
names, shapes and whole fused modules against the server's inventory, then send
the metadata over HTTP and the tensors over the session's process group, in
size-bounded buckets and a deterministic (sorted) order. Nothing moves before
every check has passed, on both sides.

Distributed trainers call ``publish`` on every rank with the same arguments:
rank 0 talks to the server; every rank takes part in gathering sharded
(FSDP/DTensor) parameters, in the same order. Needs torch, not vllm.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from verl_vllm_rm.dev.server_launcher import free_port
from verl_vllm_rm.http import JsonHttp, ServerError
from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.weight_sync.lora import find_lora_modules, full_tensor, lora_scalings
from verl_vllm_rm.protocol.names import RewardModelTrainingMode, is_head, normalize_name, resolve_name
from verl_vllm_rm.parity.probe import ParityProbe
from verl_vllm_rm.protocol.wire import (
    DEFAULT_BUCKET_BYTES,
    BufferPool,
    TransferGroup,
    dtype_name,
    open_group,
    pack,
    plan_buckets,
)

logger = logging.getLogger(__name__)
StateDictLike = Mapping[str, torch.Tensor] | torch.nn.Module


class WeightSyncError(RuntimeError):
    """A transfer that was accepted but did not complete; the server keeps its old weights."""


@dataclass(frozen=True)
class PublishResult:
    version: int
    num_params: int
    num_bytes: int
    num_buckets: int
    seconds: float
    server: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] | None = None  # the probe's figures when it ran after this publish


@dataclass(frozen=True)
class _Item:
    spec: ParamSpec
    produce: Callable[[], torch.Tensor]


def _local_address_towards(url: str) -> str:
    """The address the server can reach this trainer at (the interface that routes to it)."""
    host = urllib.parse.urlparse(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


class RewardModelPublisher:
    """Publishes reward-model weights to a server started with ``--enable-weight-updates``.

    ``group`` is the trainer's own process group over the ranks that hold the
    model (default: the default group when one exists); only its rank 0 sends.
    """

    def __init__(
        self,
        server_url: str,
        *,
        api_key: str | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        head_patterns: tuple[str, ...] | None = None,
        timeout_s: float = 300.0,
        master_address: str | None = None,
        group: dist.ProcessGroup | None = None,
        parity_probe: ParityProbe | None = None,
    ) -> None:
        self.http = JsonHttp(server_url, api_key, timeout_s=min(timeout_s, 60.0))
        self.server_url = server_url
        self.api_key = api_key
        self.parity_probe = parity_probe
        self.publishes = 0
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.master_address = master_address or _local_address_towards(server_url)
        self.group = group
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if distributed else 0
        self.world_size = dist.get_world_size(group) if distributed else 1
        info = self.http.get("/weight_inventory")
        self.inventory = Inventory.from_json(info)
        self.transport: str = info["transport"]
        self.server_world_size: int = info["world_size"]
        self.head_patterns = tuple(head_patterns or info["head_patterns"])
        self.max_update_bytes: int | None = info.get("max_update_bytes")
        self.version: int = info["version"]
        self._transfer: TransferGroup | None = None
        self._buffers: BufferPool | None = None

    # -- session ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._transfer is not None

    def connect(self) -> None:
        """Open the tensor plane (rank 0 only): host a store, ask the server to join, build the group."""
        if self.rank != 0 or self._transfer is not None:
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
        self._transfer = result["group"]

    def close(self) -> None:
        if self.rank == 0 and self._transfer is not None:
            self._transfer = None
            self.http.post("/close_communicator", {})

    def __enter__(self) -> "RewardModelPublisher":
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # never mask the error that is already propagating
            self.close()
        except Exception as e:
            logger.warning("closing the weight-sync session after an error failed too: %s", e)

    # -- what to send ----------------------------------------------------------------------

    def plan(
        self,
        state_dict: StateDictLike,
        training_mode: RewardModelTrainingMode | str,
        *,
        lora_scaling: float | Mapping[str, float] | None = None,
        adapter: str = "default",
    ) -> list[_Item]:
        """The checked, sorted list of tensors a publish would send (nothing is gathered yet)."""
        mode = RewardModelTrainingMode.parse(training_mode)
        if isinstance(state_dict, torch.nn.Module):
            if mode is RewardModelTrainingMode.LORA and lora_scaling is None:
                lora_scaling = lora_scalings(state_dict, adapter)
            state_dict = state_dict.state_dict()
        known = self.inventory.names
        sources: dict[str, Callable[[], torch.Tensor]] = {}
        meta: dict[str, tuple[tuple[int, ...], str]] = {}
        trained: set[str] = set()
        for raw, tensor in state_dict.items():
            normalized = normalize_name(raw)
            if normalized is None:
                continue
            name = resolve_name(normalized, known)
            sources[name] = lambda t=tensor: full_tensor(t)
            meta[name] = (tuple(tensor.shape), dtype_name(tensor.dtype))
            if ".modules_to_save." in raw or is_head(name, self.head_patterns):
                trained.add(name)
        if mode is RewardModelTrainingMode.LORA:
            for module in find_lora_modules(state_dict, lora_scaling, adapter):
                name = resolve_name(normalize_name(module.base), known)
                sources[name] = lambda m=module: m.merged(state_dict)
                trained.add(name)
            selected = [n for n in self.inventory.complete_groups(trained) if n in sources]
            selected += sorted(n for n in trained if n not in known)
        elif mode is RewardModelTrainingMode.HEAD_ONLY:
            selected = [n for n in sources if is_head(n, self.head_patterns)]
        else:
            selected = list(sources)
        items = []
        for name in sorted(set(selected)):
            shape, dtype = meta[name]
            server = self.inventory.params.get(name)
            items.append(_Item(ParamSpec(name, server.dtype if server else dtype, shape), sources[name]))
        self.inventory.check_update([i.spec for i in items], mode, self.head_patterns, self.max_update_bytes)
        return items

    # -- sending ---------------------------------------------------------------------------

    def publish(
        self,
        state_dict: StateDictLike,
        version: int,
        training_mode: RewardModelTrainingMode | str = RewardModelTrainingMode.FULL,
        *,
        lora_scaling: float | Mapping[str, float] | None = None,
        adapter: str = "default",
        probe_ids: Sequence[Sequence[int]] | None = None,
    ) -> PublishResult:
        """Send what ``training_mode`` changed; the server serves it as ``version`` once this returns.

        ``state_dict`` is a state dict or the model itself (needed in LoRA mode
        unless ``lora_scaling`` is given, and whenever the parity probe is due).
        ``probe_ids`` are the token ids the parity probe scores. Raises
        :class:`WeightUpdateRefused` (nothing sent, old weights serving),
        :class:`WeightSyncError`, or :class:`ParityError` (new weights serving,
        but the server does not score like ``state_dict``).
        """
        t0 = time.monotonic()
        if version <= self.version:
            raise WeightUpdateRefused(
                f"version {version} is not newer than the serving version {self.version}; versions must increase"
            )
        probe_due = self.parity_probe is not None and self.parity_probe.due(self.publishes + 1)
        if probe_due and (not isinstance(state_dict, torch.nn.Module) or not probe_ids):
            raise ValueError("the parity probe is due after this publish: pass the model itself (not a state "
                             "dict) and probe_ids (token ids to score)")
        mode = RewardModelTrainingMode.parse(training_mode)
        items = self.plan(state_dict, mode, lora_scaling=lora_scaling, adapter=adapter)
        specs = [item.spec for item in items]
        buckets = plan_buckets(specs, self.bucket_bytes)
        error, lines = self._start(specs, mode, version) if self.rank == 0 else (None, None)
        self._agree(error)
        server: dict[str, Any] = {}
        try:
            self._stream(items, buckets)
            if lines is not None:
                server = next(lines)
                lines.close()
        except Exception as e:
            self._transfer = None
            raise WeightSyncError(f"weight transfer for version {version} failed: {e}") from e
        if self.rank == 0 and server.get("status") != "ok":
            self._transfer = None
            raise WeightSyncError(f"the server could not apply version {version}: {server.get('error', server)}")
        self.version = version
        self.publishes += 1
        parity = self._check_parity(state_dict, probe_ids) if probe_due else None
        return PublishResult(
            version, len(items), sum(b.nbytes for b in buckets), len(buckets), time.monotonic() - t0, server,
            parity,
        )

    def _check_parity(self, model: torch.nn.Module, probe_ids: Sequence[Sequence[int]]) -> dict[str, Any] | None:
        """Every rank computes the reference (a sharded forward is collective); rank 0 asks the server."""
        reference = self.parity_probe.reference_scores(model, probe_ids)
        error, figures = None, None
        if self.rank == 0:
            try:
                report = self.parity_probe.compare(reference, probe_ids, self.server_url, self.api_key, self.version)
                figures = report.as_dict()
            except Exception as e:  # every rank learns it through _agree
                error = e
        self._agree(error)
        return figures

    def _start(
        self, specs: list[ParamSpec], mode: RewardModelTrainingMode, version: int
    ) -> tuple[Exception | None, Iterator[dict[str, Any]] | None]:
        """Connect if needed and send the metadata: ``(None, answer lines)`` once accepted, else the error."""
        try:
            self.connect()
        except Exception as e:  # reported to every rank by _agree
            return (e, None)
        body = {
            "metadata": [s.to_json() for s in specs],
            "training_mode": mode.value,
            "version": version,
            "bucket_bytes": self.bucket_bytes,
        }
        for attempt in range(2):
            lines = self.http.post_lines("/update_param_batch", body, timeout_s=self.timeout_s + 30)
            try:
                first = next(lines)
            except ServerError as e:
                if attempt == 0 and e.status == 409 and "no communicator" in e.message:
                    self._transfer = None  # the server dropped the session (an earlier failure): rejoin
                    try:
                        self.connect()
                    except Exception as connect_error:
                        return (connect_error, None)
                    continue
                return (WeightUpdateRefused(e.message) if e.status < 500 else e, None)
            except OSError as e:
                return (e, None)
            if first.get("status") != "accepted":
                return (WeightSyncError(f"unexpected answer from the server: {first}"), None)
            return (None, lines)
        raise AssertionError("unreachable")

    def _agree(self, error: Exception | None) -> None:
        """Every rank learns rank 0's outcome before anyone starts gathering (or nobody does)."""
        if self.world_size > 1:
            box = [None if error is None else (isinstance(error, WeightUpdateRefused), str(error))]
            dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group else 0,
                                       group=self.group)
            if error is None and box[0] is not None:
                refused, message = box[0]
                error = WeightUpdateRefused(message) if refused else WeightSyncError(f"rank 0 failed: {message}")
        if error is not None:
            raise error

    def _stream(self, items: list[_Item], buckets) -> None:
        """Gather (all ranks), pack and broadcast (rank 0): bucket i is packed while i-1 is on the wire."""
        by_name = {item.spec.name: item for item in items}
        in_flight: list = [None, None]
        for i, bucket in enumerate(buckets):
            tensors = [by_name[slot.spec.name].produce() for slot in bucket.slots]
            if self._transfer is None:
                continue
            if in_flight[i % 2] is not None:
                in_flight[i % 2].wait()
            if self._buffers is None or self._buffers.device != self._transfer.device:
                self._buffers = BufferPool(self._transfer.device)
            buffer = pack(bucket, tensors, self._buffers.get(i % 2, bucket.nbytes))
            in_flight[i % 2] = self._transfer.broadcast(buffer)
        for work in in_flight:
            if work is not None:
                work.wait()
