"""``RewardModelPublisher``: push a trained reward model's weights into the running server.

One publish: choose what the training mode changed and check it against the
server's inventory (:mod:`.selection`), then send the metadata over HTTP and the
tensors over the session's process group, in size-bounded buckets and a
deterministic (sorted) order (:mod:`.transfer`). Nothing moves before every check
has passed, on both sides.

Distributed trainers call ``publish`` on every rank with the same arguments:
rank 0 talks to the server; every rank takes part in gathering sharded
(FSDP/DTensor) parameters, in the same order. Needs torch, not vllm.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import torch.distributed as dist

from verl_vllm_rm.client.http import HttpError, JsonHttp
from verl_vllm_rm.parity.probe import UNIT_ROUNDOFF, ParityProbe, coarsest
from verl_vllm_rm.protocol.inventory import Inventory, WeightUpdateRefused
from verl_vllm_rm.protocol.lora import LoraBases
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES, Bucket, nccl_version, plan_buckets, transport_mismatch
from verl_vllm_rm.weight_sync.lora_wire import LoraWire
from verl_vllm_rm.weight_sync.outgoing import Selection, StateDictLike
from verl_vllm_rm.weight_sync.selection import select_update
from verl_vllm_rm.weight_sync.transfer import TransferSession, WeightSyncError, is_refusal, local_address_towards

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishResult:
    version: int
    num_params: int
    num_bytes: int
    num_buckets: int
    seconds: float
    server: dict[str, Any] = field(default_factory=dict)
    parity: dict[str, Any] | None = None  # the probe's figures when it ran after this publish
    peak_gathered_bytes: int = 0  # the most gathered (full or merged) tensor bytes this rank held at once
    lora_adapters: bool = False  # whether LoRA adapters travelled (the server merged them), not merged weights


class ClosedOnExit:
    """``with`` support for a publisher: its ``close()`` on the way out, never masking an error already raised."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # never mask the error that is already propagating
            self.close()
        except Exception as e:
            logger.warning("closing the weight-sync session(s) after an error failed too: %s", e)


class RewardModelPublisher(ClosedOnExit):
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
        lora_wire: str = "auto",
    ) -> None:
        """``lora_wire`` (training mode ``lora``): ``auto`` sends the adapters when the server holds the base
        weights (``--weight-update-lora-bases``), else merged weights with a warning; ``adapters`` refuses to
        publish merged weights; ``merged`` always sends them."""
        self.lora = LoraWire(lora_wire, server_url, logger)
        self.http = JsonHttp(server_url, api_key, timeout_s=min(timeout_s, 60.0))
        self.server_url = server_url
        self.api_key = api_key
        self.parity_probe = parity_probe
        self.publishes = 0
        self.bucket_bytes = bucket_bytes
        self.group = group
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank(group) if distributed else 0
        self.world_size = dist.get_world_size(group) if distributed else 1
        info = self.http.get("/weight_inventory")
        mismatch = transport_mismatch(info["transport"], info.get("nccl_version"), nccl_version())
        if mismatch:  # before any communicator forms or tensor moves
            raise WeightUpdateRefused(f"cannot publish to {server_url}: {mismatch}")
        self.inventory = Inventory.from_json(info)
        self.transport: str = info["transport"]
        self.head_patterns = tuple(head_patterns or info["head_patterns"])
        self.max_update_bytes: int | None = info.get("max_update_bytes")
        self.version: int = info["version"]
        self.server_dtype = coarsest(*{p.dtype for p in self.inventory.params.values()} & UNIT_ROUNDOFF.keys())
        self.session = TransferSession(
            self.http, self.transport, info["world_size"], timeout_s=timeout_s, bucket_bytes=bucket_bytes,
            master_address=master_address or local_address_towards(server_url), stall_timeout_s=info["stall_timeout_s"],
        )

    @property
    def lora_wire(self) -> str:
        """What a LoRA publish may send: ``auto``, ``adapters`` or ``merged`` (see :class:`.lora_wire.LoraWire`)."""
        return self.lora.wire

    # -- session ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.session.connected

    def connect(self) -> None:
        """Open the tensor plane (rank 0 only): host a store, ask the server to join, build the group."""
        if self.rank == 0:
            self.session.connect()

    def close(self) -> None:
        self.session.close()

    # -- publishing ------------------------------------------------------------------------

    def plan(
        self,
        state_dict: StateDictLike,
        training_mode: RewardModelTrainingMode | str,
        *,
        lora_scaling: float | Mapping[str, float] | None = None,
        adapter: str = "default",
    ) -> Selection:
        """The checked, sorted tensors a publish would send (nothing is gathered yet)."""
        return select_update(self.inventory, state_dict, RewardModelTrainingMode.parse(training_mode),
                             self.head_patterns, self.max_update_bytes, lora_scaling=lora_scaling, adapter=adapter,
                             lora_wire=self.lora_wire)

    def publish(
        self,
        state_dict: StateDictLike,
        version: int,
        training_mode: RewardModelTrainingMode | str = RewardModelTrainingMode.FULL,
        *,
        lora_scaling: float | Mapping[str, float] | None = None,
        adapter: str = "default",
        probe_ids: Sequence[Sequence[int]] | None = None,
        commit: bool = True,
    ) -> PublishResult:
        """Send what ``training_mode`` changed; the server serves it as ``version`` once this returns.

        ``commit=False`` is the first phase of a two-phase commit over several servers: the server
        receives and stages ``version`` and keeps serving the old weights until :meth:`commit` (or
        :meth:`abort`); the parity probe then runs at :meth:`commit`'s caller's discretion, not here.

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
        probe_due = commit and self.parity_probe is not None and self.parity_probe.due(self.publishes + 1,
                                                                                       state_dict, probe_ids)
        mode = RewardModelTrainingMode.parse(training_mode)

        def plan() -> Selection:
            return self.plan(state_dict, mode, lora_scaling=lora_scaling, adapter=adapter)

        def announce(selection: Selection) -> tuple[list[Bucket], Iterator[dict[str, Any]] | None]:
            return self._announce(selection, mode, version, commit)

        # adapters refused by a server whose base store failed since it was read: one more offer, merged
        selection, (buckets, lines) = self.lora.offer(plan, announce, self._lora_bases_now, leader=self.rank == 0)
        items = selection.items
        server: dict[str, Any] = {}
        try:
            peak = self.session.stream(items, buckets)
            if lines is not None:
                server = next(lines)
                lines.close()
        except Exception as e:
            self.session.drop()
            raise WeightSyncError(f"weight transfer for version {version} failed: {e}") from e
        if self.rank == 0 and server.get("status") != ("ok" if commit else "staged"):
            self.session.drop()
            raise WeightSyncError(f"the server could not {'apply' if commit else 'stage'} version {version}: "
                                  f"{server.get('error', server)}")
        parity = None
        if commit:
            self.version = version
            self.publishes += 1
        if probe_due:
            figures, failures = self.parity_probe.check(state_dict, probe_ids, [self.server_url], self.api_key,
                                                        version, leader=self.rank == 0, server_dtype=self.server_dtype)
            self.agree(failures.get(self.server_url))
            parity = figures.get(self.server_url)
        return PublishResult(version, len(items), sum(b.nbytes for b in buckets), len(buckets),
                             time.monotonic() - t0, server, parity, peak, selection.lora_scaling is not None)

    def _announce(self, selection: Selection, mode: RewardModelTrainingMode, version: int,
                  commit: bool) -> tuple[list[Bucket], Iterator[dict[str, Any]] | None]:
        """Plan the buckets (a bad bucket size is refused before anything is sent), then send the update's metadata
        (rank 0); the buckets, and the server's remaining answer lines on rank 0 (``None`` elsewhere). Every rank
        raises rank 0's refusal or failure."""
        specs = [item.spec for item in selection.items]
        buckets = plan_buckets(specs, self.bucket_bytes)
        error, lines = None, None
        if self.rank == 0:
            try:
                lines = self.session.announce(specs, mode, version, "now" if commit else "deferred",
                                              selection.lora_scaling)
            except Exception as e:  # every rank learns it through agree
                error = e
        self.agree(error)
        return buckets, lines

    def _lora_bases_now(self) -> LoraBases:
        """The LoRA base store as the server reports it now (rank 0 asks; every rank records the answer)."""
        bases = self.share(self.http.get("/weight_inventory")["lora_bases"] if self.rank == 0 else None)
        self.inventory.set_lora_bases(LoraBases.from_json(bases))
        return self.inventory.lora_bases

    def commit(self, version: int) -> dict[str, Any]:
        """Apply the staged ``version`` (rank 0 asks the server; every rank records the new version)."""
        record = self._second_phase("/commit_update", version) if self.rank == 0 else {"status": "ok"}
        self.version = version
        self.publishes += 1
        return record

    def abort(self, version: int) -> dict[str, Any]:
        """Drop the staged ``version``: the server keeps serving the weights it had."""
        return self._second_phase("/abort_update", version) if self.rank == 0 else {"status": "aborted"}

    def _second_phase(self, path: str, version: int) -> dict[str, Any]:
        try:
            return self.http.post(path, {"version": version})
        except HttpError as e:
            if is_refusal(e):
                raise WeightUpdateRefused(e.message) from None
            raise WeightSyncError(f"{path} for version {version} failed: {e.cause}") from None

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (a picklable object)."""
        if self.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
        return box[0]

    def agree(self, error: Exception | None) -> None:
        """Every rank learns rank 0's outcome before anyone starts gathering (or nobody does)."""
        outcome = self.share(None if error is None else (isinstance(error, WeightUpdateRefused), str(error)))
        if error is None and outcome is not None:
            refused, message = outcome
            error = WeightUpdateRefused(message) if refused else WeightSyncError(f"rank 0 failed: {message}")
        if error is not None:
            raise error
