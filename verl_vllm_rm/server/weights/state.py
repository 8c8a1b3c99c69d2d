"""The server's one weight-sync state: the serving version, the update under way, and how updates arrive.

It lives in ``app.state.reward.weights`` on every reward server: the score routes read the
serving version and pass the gate; with ``--enable-weight-updates`` the weight routes also
record the transport, the communicator session and each update here.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from verl_vllm_rm.protocol.errors import WEIGHTS_LOST
from verl_vllm_rm.protocol.inventory import Inventory
from verl_vllm_rm.server.weights.gate import UpdateGate

DEFAULT_JOIN_TIMEOUT_S = 30.0  # --weight-update-join-timeout
DEFAULT_STALL_TIMEOUT_S = 120.0  # --weight-update-stall-timeout


class WeightsLost(RuntimeError):
    """A /score that would run on lost weights (its 503)."""


@dataclass
class WeightSyncState:
    version: int = 0  # the serving weights' (GET /runtime_version; every /score answer carries it)
    gate: UpdateGate = field(default_factory=UpdateGate)  # each /score runs entirely before or after a reload
    last_update: dict[str, Any] = field(default_factory=dict)
    last_failed_update: dict[str, Any] = field(default_factory=dict)
    pending_update: int | None = None  # the version being received or applied
    staged_update: dict[str, Any] | None = None  # a received update waiting for /commit_update or /abort_update
    staged_expiry: asyncio.Task | None = None  # drops the staged update when no commit comes in time
    # set by install_weight_routes (--enable-weight-updates)
    transport: str | None = None
    nccl_version: str | None = None  # the workers' NCCL (None without CUDA): a trainer must use the same
    head_patterns: tuple[str, ...] = ()
    max_update_bytes: int | None = None
    lora_bases: str = "off"  # --weight-update-lora-bases: where the workers keep the LoRA base store
    lora_bases_max_bytes: int | None = None  # --weight-update-lora-bases-max-bytes
    rollback_max_bytes: int | None = None  # --weight-update-rollback-max-bytes
    lost: str | None = None  # why the serving weights are lost (a reload failed with no copy): nothing scores
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    # the most any wait of a transfer lasts with no progress (a bucket, a staged update's commit)
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    inventory: Inventory | None = None
    inventory_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one engine read, however many ask at once
    session: str | None = None
    update_task: asyncio.Task | None = None
    control: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def serving_version(self) -> int | None:
        """The version the server serves, None while its weights are lost."""
        return None if self.lost is not None else self.version

    @asynccontextmanager
    async def scoring(self) -> AsyncIterator[int]:
        """Hold the gate for one /score (no update lands inside it); the version that computes every score in it.
        Raises :class:`WeightsLost` when the weights are lost, read inside the gate: a request that waited there
        through a reload that failed half-way and could not be undone never scores on what it left."""
        async with self.gate.scoring():
            if self.lost is not None:
                raise WeightsLost(self.lost_message())
            yield self.version

    def lost_message(self) -> str:
        return (f"{WEIGHTS_LOST}{self.lost}; it scores nothing until a full publish (training_mode full) succeeds or "
                "it restarts")

    def busy(self) -> str | None:
        """Why no other update or communicator change may start now (None: nothing is in the way)."""
        if self.update_task is not None and not self.update_task.done():
            return "a weight update is in progress; retry after it finishes"
        if self.staged_update is not None:
            return (f"version {self.staged_update['version']} is staged: POST /commit_update or /abort_update "
                    f"with it first (the server drops it by itself {self.stall_timeout_s:g} s after it was staged, "
                    "--weight-update-stall-timeout)")
        return None
