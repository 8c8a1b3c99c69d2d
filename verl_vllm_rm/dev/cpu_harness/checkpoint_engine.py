"""``cpu_gloo``: a verl checkpoint engine that moves the policy's weights to standalone rollout replicas over gloo.

verl 0.9.1's ``separate_async`` mode runs generation on replicas of their own and syncs them through a
checkpoint engine that must not be ``naive`` (``trainer_separate_async.py``); every other backend verl ships
needs a GPU library (nccl, nixl and delta_sharded import ``cupy``, hccl ``vllm``, kimi and mooncake their own).
This one is verl's NCCL engine's protocol on a CPU transport: actor rank 0 broadcasts the weights bucket by
bucket (verl's own ``split_weight_chunks`` / ``merge_weight_chunks``) to every rollout worker, over a gloo
group private to the update (:func:`verl_vllm_rm.protocol.wire.open_group`), rebuilt at each update as verl
asks (``prepare`` -> ``build_topology`` -> ``init_process_group`` -> send/receive -> ``finalize``).

Each bucket crosses as three broadcasts: a header (metadata length, data length, last?), the pickled
:class:`TensorMeta` list, the bytes.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Any, AsyncGenerator, Generator

import torch
from verl.checkpoint_engine.base import CheckpointEngine, TensorMeta, merge_weight_chunks, split_weight_chunks
from verl.workers.rollout.utils import ensure_async_iterator

from verl_vllm_rm.client.http import free_port
from verl_vllm_rm.protocol.wire import TransferGroup, open_group

BACKEND = "cpu_gloo"
#: how long a join or a broadcast may wait for the other side before the update fails
TIMEOUT_S = 600.0
HOST = "127.0.0.1"  # the CPU harness runs one machine
#: each chunk starts at a multiple of this many bytes, so the receiver can view it as any dtype in place
ALIGN = 16


class CPUGlooCheckpointEngine(CheckpointEngine):
    """Actor rank 0 sends; other actor ranks walk the weights (gathering them is collective) and send nothing."""

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = TIMEOUT_S) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.timeout_s = timeout_s
        self.group: TransferGroup | None = None
        self.rank: int | None = None

    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {}
        return {"host": HOST, "port": free_port(HOST), "session": f"cpu_gloo-{uuid.uuid4().hex}"}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        master = metadata[0]
        if "port" not in master:
            raise ValueError("cpu_gloo: actor rank 0 must be the checkpoint engine's master (is_master)")
        world_size = 1 + rollout_world_size
        actor = {"rank": [0] + [-1] * (actor_wg_world_size - 1), "world_size": [world_size] * actor_wg_world_size,
                 "master": [master] * actor_wg_world_size}
        rollout = {"rank": list(range(1, world_size)), "world_size": [world_size] * rollout_world_size,
                   "master": [master] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: dict[str, Any]) -> None:
        self.rank = rank
        if rank >= 0:
            self.group = open_group("gloo", master["host"], master["port"], rank, world_size, self.timeout_s,
                                    master["session"])

    def finalize(self) -> None:
        self.group = None  # the gloo group and its store close with their last reference
        self.rank = None

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        self.group.broadcast(tensor, root=0).wait()
        return tensor

    def _send_bucket(self, metas: list[TensorMeta], chunks: list[torch.Tensor], last: bool) -> None:
        meta = torch.frombuffer(bytearray(pickle.dumps(metas)), dtype=torch.uint8)
        data = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
        self._broadcast(torch.tensor([meta.numel(), data.numel(), int(last)], dtype=torch.int64))
        self._broadcast(meta)
        self._broadcast(data)

    @torch.no_grad()
    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                           global_steps: int | None = None) -> dict:
        if self.rank is None or self.rank < 0:
            async for _ in ensure_async_iterator(weights):  # producing each weight is collective over the actors
                pass
            return {}
        metas: list[TensorMeta] = []
        chunks: list[torch.Tensor] = []
        size = 0
        async for meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if size + meta.chunk_size > self.bucket_size and chunks:
                self._send_bucket(metas, chunks, last=False)
                metas, chunks, size = [], [], 0
            if size % ALIGN:
                chunks.append(torch.zeros(ALIGN - size % ALIGN, dtype=torch.uint8))
                size += ALIGN - size % ALIGN
            meta.offset = size
            metas.append(meta)
            chunks.append(chunk.contiguous())
            size += meta.chunk_size
        self._send_bucket(metas, chunks, last=True)
        return {}

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor], None]:
        while True:
            meta_len, data_len, last = self._broadcast(torch.zeros(3, dtype=torch.int64)).tolist()
            metas: list[TensorMeta] = pickle.loads(self._broadcast(torch.empty(meta_len, dtype=torch.uint8))
                                                   .numpy().tobytes())
            data = self._broadcast(torch.empty(data_len, dtype=torch.uint8))
            for meta in metas:
                yield meta, data[meta.offset:meta.offset + meta.chunk_size]
            if last:
                return

    @torch.no_grad()
    async def receive_weights(self, global_steps: int | None = None
                              ) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        if self.rank is None or self.rank <= 0:
            raise RuntimeError("cpu_gloo: only rollout workers (rank >= 1) receive weights")
        async for name, weight in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, weight
