"""Worker side of weight updates: a vLLM weight-transfer engine over a torch process group.

vLLM's native machinery drives the lifecycle (``init_weight_transfer_engine`` ->
``start_weight_update`` -> ``update_weights`` -> ``finish_weight_update``, each a
``collective_rpc`` into every worker); this module supplies the engine it calls.
vLLM ships NCCL engines whose trainer side needs vllm itself; ours builds a plain
``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU) on a store the trainer
hosts, so the trainer needs torch only (:mod:`verl_vllm_rm.protocol.wire`).

Atomicity: ``update_weights`` only *stages* the received buckets (on a
background thread, so the worker keeps scoring meanwhile); the model is
touched in ``finish_weight_update`` through vLLM's layerwise reload (plain
``load_weights`` fails on repacked CPU weights), scoped to the modules the
update touches. A transfer that dies halfway therefore leaves the old weights
serving, never a mix; so does a reload that fails half-way, undone by reloading
the touched modules from the values they served (:mod:`.rollback`), or else the
server's weights are reported lost and it scores nothing. An update carrying LoRA
adapters is merged there too, each adapted weight from the worker's immutable base
store, after the received adapters were checked finite (:mod:`.lora_merge`).

Memory: an update is received one bucket at a time into a single buffer on the
worker's device, and each bucket is copied out to host memory (pinned with
CUDA) before the next arrives. The device never holds more than one bucket of
an update, whatever its size (a full 7B bf16 update is ~14 GB, more than the
memory vLLM leaves free on most cards); the staged update waits on the host,
and the reload then materializes one layer at a time on the device (vLLM's
layerwise reload), copying that layer's weights from the host. One code path
on every device: on a CPU worker the copy-out is a memcpy, and the test of the
bound measures it there (tests/integration/weight_sync/test_tensor_parallel.py).

Joining the trainer's group runs on a thread as well (``init_weight_transfer_engine``
with ``phase`` ``begin``, polled with ``rm_join_done``, then ``finish``): a trainer
address that never answers neither stalls scoring nor leaves a half-joined group
(see :mod:`verl_vllm_rm.server.weights.join`).

Importing this module (vLLM does, via ``--worker-extension-cls``) registers the
engines under the backend names ``gloo`` and ``torch_nccl``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from vllm.distributed.weight_transfer import WeightTransferEngine, WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import WeightTransferInitInfo, WeightTransferUpdateInfo

from verl_vllm_rm.protocol.inventory import ParamSpec, module_key
from verl_vllm_rm.protocol.wire import BufferPool, TransferGroup, open_group, plan_buckets, unpack
from verl_vllm_rm.server.weights.join import PendingJoin
from verl_vllm_rm.server.weights.lora_merge import LoraMerge
from verl_vllm_rm.server.weights.rollback import UndoableReload

ENGINE_BACKENDS = {"gloo": "gloo", "torch_nccl": "nccl"}


@dataclass
class ProcessGroupInitInfo(WeightTransferInitInfo):
    master_address: str
    master_port: int
    world_size: int
    session: str
    rank_offset: int = 1
    timeout_s: float = 300.0  # every collective's
    join_timeout_s: float | None = None  # the store's and the rendezvous' (default timeout_s)
    phase: str = "begin"  # "begin": start joining on a thread; "finish": take its group, raise its error


@dataclass
class ProcessGroupUpdateInfo(WeightTransferUpdateInfo):
    params: list[dict[str, Any]]
    bucket_bytes: int
    phase: str = "begin"  # "begin": start receiving in the background; "join": wait for it, raise its error
    lora_scaling: dict[str, float] | None = None  # with LoRA adapters: merge them into the base store's weights
    rollback_max_bytes: int | None = None  # --weight-update-rollback-max-bytes: the host copy of touched modules


ABORT_PHASE = "abort"  # the update_weights phase that drops what was staged (``/abort_update``)


class UpdateAborted(RuntimeError):
    """Raised on purpose by the ``abort`` phase (``/abort_update``)."""


def _run_phase(kind: str, phase: str, handlers: dict[str, Callable[[], None]]) -> None:
    """The handler of one phase of a two-call step (vLLM calls each lifecycle method once per phase)."""
    handler = handlers.get(phase)
    if handler is None:
        raise ValueError(f"unknown {kind} phase {phase!r}; use {' or '.join(map(repr, handlers))}")
    handler()


class ProcessGroupWeightTransferEngine(WeightTransferEngine[ProcessGroupInitInfo, ProcessGroupUpdateInfo]):
    """Receives bucketed broadcasts from trainer rank 0, then reloads layerwise."""

    init_info_cls = ProcessGroupInitInfo
    update_info_cls = ProcessGroupUpdateInfo
    transport: str = "gloo"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.group: TransferGroup | None = None
        # both kept between updates (see BufferPool): the one bucket on the device, the staged update on the host
        self.landing: BufferPool | None = None
        self.staging: BufferPool | None = None
        self.staged: list[tuple[str, torch.Tensor]] = []
        self.receiver: threading.Thread | None = None
        self.receive_error: BaseException | None = None
        self.received_buckets = 0  # of the update being received: its progress
        self.pending_join: PendingJoin | None = None
        self.loaded_at_ns = time.time_ns()  # vLLM makes this engine right after loading the model's weights
        self.lora = LoraMerge(self.loaded_at_ns)
        self.rollback_max_bytes: int | None = None  # the staged update's
        self.reloads: UndoableReload | None = None  # made at the first inventory read

    def init_transfer_engine(self, init_info: ProcessGroupInitInfo) -> None:
        _run_phase("init", init_info.phase, {"begin": lambda: self.begin_join(init_info), "finish": self.finish_join})

    def begin_join(self, info: ProcessGroupInitInfo) -> None:
        """Drop any group (or pending join), then join the new one on a thread; returns at once."""
        self.shutdown()
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank

        def open_fn() -> TransferGroup:
            return open_group(
                self.transport, info.master_address, info.master_port, rank=worker_rank + info.rank_offset,
                world_size=info.world_size, timeout_s=info.timeout_s, session=info.session,
                join_timeout_s=info.join_timeout_s, device=self.device,  # the worker's device, not the thread's
            )

        self.pending_join = PendingJoin(open_fn, info.master_address, info.master_port)

    def join_done(self) -> bool:
        return self.pending_join is None or self.pending_join.done()

    def finish_join(self) -> None:
        pending, self.pending_join = self.pending_join, None
        if pending is None:
            # internal: join_group sends "finish" only after its own "begin", both under the router's control lock
            raise RuntimeError("no join in progress: begin one with /init_communicator")
        if not pending.done():
            pending.abandon()
            # internal: join_group sends "finish" only once every worker's rm_join_done says the join has ended
            raise TimeoutError("the join of the trainer's process group has not finished; abandoned")
        self.group = pending.result()

    def start_weight_update(self) -> None:
        self.staged = []

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """``begin``: receive on a thread of its own and return at once; ``join``: wait, then raise its error.

        The worker keeps scoring with the old weights while the buckets arrive (they
        only fill the staging buffers), so a publish stalls scoring for the reload
        alone, and a trainer that stalls or dies mid-transfer does not stall it at all.
        """
        if update_info.get("phase") == ABORT_PHASE:  # drop a staged update; raising makes vLLM close the session
            self.staged, self.lora.scaling = [], None
            # internal: raised on purpose for /abort_update, whose apply.abort_update catches it (status "aborted")
            raise UpdateAborted("update aborted: the staged weights were dropped, the serving ones never changed")
        info = self.parse_update_info(update_info)
        _run_phase("update", info.phase, {"begin": lambda: self.begin_receive(info), "join": self.join_receive})

    def begin_receive(self, update_info: ProcessGroupUpdateInfo) -> None:
        if self.group is None:
            # internal: /update_param_batch needs a session (else 409); whatever drops this group clears the session
            raise RuntimeError("no communicator: the trainer must call /init_communicator first")
        if self.receiver is not None and self.receiver.is_alive():
            # internal: an update's task waits for all receives to end (rm_receive_progress), and blocks others (409)
            raise RuntimeError("a weight transfer is still being received")
        self.staged, self.receive_error, self.received_buckets = [], None, 0
        self.lora.scaling, self.rollback_max_bytes = update_info.lora_scaling, update_info.rollback_max_bytes
        device = self.group.device

        def receive() -> None:
            try:
                if device.type == "cuda":
                    torch.cuda.set_device(device)
                self.receive_weights(update_info)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except BaseException as e:  # handed to the join
                self.staged, self.receive_error = [], e

        self.receiver = threading.Thread(target=receive, name="rm-weight-receive", daemon=True)
        self.receiver.start()

    def receive_progress(self) -> tuple[bool, int]:
        """Whether the receive has ended, and how many buckets it has received so far."""
        return self.receiver is None or not self.receiver.is_alive(), self.received_buckets

    def join_receive(self) -> None:
        if self.receiver is None:
            # internal: apply._receive sends "join" only after its own "begin" started the receiver
            raise RuntimeError("no weight transfer was started")
        self.receiver.join()
        self.receiver, error, self.receive_error = None, self.receive_error, None
        if error is not None:
            raise RuntimeError(f"receiving the weights failed: {type(error).__name__}: {error}") from error

    def receive_weights(self, update_info: ProcessGroupUpdateInfo) -> None:
        """Each bucket lands in the one device buffer, then goes to its own host buffer (see the module)."""
        specs = [ParamSpec.from_json(p) for p in update_info.params]
        device = self.group.device
        if self.landing is None or self.landing.device != device:
            self.landing = BufferPool(device)
        if self.staging is None:
            self.staging = BufferPool(torch.device("cpu"), pin_memory=device.type == "cuda")
        staged: list[tuple[str, torch.Tensor]] = []
        buckets = plan_buckets(specs, update_info.bucket_bytes)
        for i, bucket in enumerate(buckets):
            landing = self.landing.get(0, bucket.nbytes)
            self.group.wait(self.group.broadcast(landing, root=0),
                            f"waiting for bucket {i + 1} of {len(buckets)} from the trainer")
            host = self.staging.get(i, bucket.nbytes)
            host.copy_(landing)  # blocking: the landing buffer is free for the next bucket when this returns
            staged.extend(unpack(bucket, host))
            self.received_buckets = i + 1
        self.lora.check_received(staged)
        self.staged = staged

    def receive_memory(self) -> dict[str, int]:
        """Bytes this worker holds for updates: on its device (one bucket at most) and staged on the host."""
        return {"device_bytes": self.landing.nbytes if self.landing else 0,
                "host_bytes": self.staging.nbytes if self.staging else 0}

    def rollback_memory(self) -> int:
        """Bytes of host memory the copies a failed reload is undone from held during the last reload (the ones
        kept from earlier updates and this one's own; see ``ServedValues.keeping``)."""
        return self.reloads.served.reload_nbytes if self.reloads is not None else 0

    def finish_weight_update(self) -> None:
        """Load the staged update into the modules it touches; undo a reload that fails half-way (see
        :mod:`.rollback`): the old weights serve exactly, or ``reloads.lost`` says why they could not be restored."""
        staged, self.staged = self.staged, []
        names, weights, recipes = self.lora.to_load(staged, self.device)  # adapters merged from the base store
        if not staged:
            # internal: a reload follows a receive that staged a non-empty update; a staged one blocks other updates
            raise RuntimeError("finish_weight_update without received weights")
        if self.reloads is None:
            # internal: the router reads the inventory (which makes it) before it accepts any update
            raise RuntimeError("a reload before the first inventory read")
        self.reloads.run(self.model, self.model_config, names, weights, self.rollback_max_bytes, recipes)
        if self.staging is not None and self._model_aliases(self.staging):
            self.staging = None  # a loader kept a received tensor as is: never overwrite it in place

    def _model_aliases(self, pool: BufferPool) -> bool:
        pool_storages = {b.untyped_storage().data_ptr() for b in pool.buffers}
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return any(t.untyped_storage().data_ptr() in pool_storages for t in tensors)

    def shutdown(self) -> None:
        """Leave the group; abandon a join still under way (its sockets to the trainer are shut down)."""
        pending, self.pending_join = self.pending_join, None
        if pending is not None:
            pending.abandon()
        self.group = None
        self.staged, self.lora.scaling = [], None


class NcclProcessGroupWeightTransferEngine(ProcessGroupWeightTransferEngine):
    transport = "nccl"


WeightTransferEngineFactory.register_engine("gloo", ProcessGroupWeightTransferEngine)
WeightTransferEngineFactory.register_engine("torch_nccl", NcclProcessGroupWeightTransferEngine)


class WeightSyncWorkerExtension:
    """Mixed into vLLM's worker by ``--worker-extension-cls``; reached via ``collective_rpc``."""

    def rm_join_done(self) -> bool:
        """Whether the background join started by /init_communicator has ended (polled by the server)."""
        return self.weight_transfer_engine.join_done()

    def rm_receive_progress(self) -> tuple[bool, int]:
        """Whether the background receive of the current update has ended, and its buckets so far (polled by the
        server)."""
        return self.weight_transfer_engine.receive_progress()

    def rm_close_failed_reload(self) -> str | None:
        """After ``finish_weight_update`` raised (or a receive stalled past its bound): close vLLM's update session,
        which it leaves open then (vLLM 0.32's ``Worker.finish_weight_update``, ``vllm/v1/worker/gpu_worker.py``,
        clears ``_weight_update_active`` and resets the reload target only after the engine's finish returns: every
        later update would be refused as already active, and dropping the session would raise); why this worker's
        weights are lost, None when the reload was undone exactly (or never began)."""
        self._weight_update_active = False
        engine = self.weight_transfer_engine
        engine.reset_weight_update_target()
        if engine.reloads is None:
            return None
        lost, engine.reloads.lost = engine.reloads.lost, None
        return lost

    def rm_receive_memory(self) -> dict[str, int]:
        """Bytes held for weight updates, on the worker's device and on the host (see ``receive_weights``)."""
        return self.weight_transfer_engine.receive_memory()

    def rm_rollback_memory(self) -> int:
        """Host bytes of this worker's rollback copies during the last reload (see ``rollback_memory``)."""
        return self.weight_transfer_engine.rollback_memory()

    def rm_weight_inventory(self, lora_bases: str = "off", lora_bases_max_bytes: int | None = None,
                            head_patterns: tuple[str, ...] = ()) -> dict[str, Any]:
        """Checkpoint-format names and shapes the model loads, each in the dtype the server keeps it in.

        Read once from the model's own weight files through vLLM's loader (the
        same names ``load_weights`` accepts), plus the model's fused modules. A
        weight's dtype is its parameter's in the served model: vLLM keeps a pooling
        model's head in fp32 (``model_config.head_dtype``) under a bf16 backbone,
        and a head published in bf16 would lose what the trainer's fp32 head has.

        The first call also plans the LoRA base store (``lora_bases``: ``host``,
        ``device`` or ``off``; see :mod:`.lora_merge`): every weight and bias of the
        linear modules outside the head, in its served dtype. Only the room for it is
        checked here; :meth:`rm_begin_lora_capture` copies it. It also makes the
        worker's undoable reload (:mod:`.rollback`), which reads the weight files
        again only to undo a failed reload of weights no update has replaced.
        """
        from vllm.model_executor.layers.linear import LinearBase

        from verl_vllm_rm.protocol.names import is_head
        from verl_vllm_rm.protocol.wire import dtype_name, nccl_version

        model = self.model_runner.get_model()
        model_config = self.vllm_config.model_config
        fused = dict(getattr(model, "packed_modules_mapping", {}) or {})
        modules = dict(model.named_modules())
        params, bases = [], []
        for name, tensor in self._read_weight_files():
            dtype = tensor.dtype
            if tensor.is_floating_point():
                module = modules.get(module_key(name, fused))
                served = getattr(module, name.rpartition(".")[2], None)
                floating = isinstance(served, torch.Tensor) and served.is_floating_point()
                dtype = served.dtype if floating else model_config.dtype
                if isinstance(module, LinearBase) and not is_head(name, head_patterns):
                    bases.append((name, tuple(tensor.shape), dtype))
            params.append({"name": name, "dtype": dtype_name(dtype), "shape": list(tensor.shape)})
        engine = self.weight_transfer_engine
        engine.lora.plan(lora_bases, engine.device, fused, bases, lora_bases_max_bytes, model_config.model,
                         model_config.quantization)
        if engine.reloads is None:
            engine.reloads = UndoableReload(self._read_weight_files, model_config.model, engine.loaded_at_ns)
        engine.reloads.checkpoint_names = [p["name"] for p in params]
        return {"params": params, "fused_modules": {k: list(v) for k, v in fused.items()},
                "nccl_version": nccl_version(), "lora_bases": self.rm_lora_bases()}

    def rm_lora_bases(self) -> dict[str, Any]:
        """The LoRA base store as ``/weight_inventory`` reports it."""
        return self.weight_transfer_engine.lora.report()

    def rm_begin_lora_capture(self) -> None:
        """Start copying the planned LoRA base store from the model's weight files (a second read of them), once,
        on a thread of its own: the engine goes on scoring meanwhile."""
        self.weight_transfer_engine.lora.begin_capture(self._read_weight_files)

    def rm_lora_capture_done(self) -> bool:
        """Whether the copy of the LoRA base store has ended (polled by the server)."""
        return self.weight_transfer_engine.lora.capture_done()

    def rm_finish_lora_capture(self) -> dict[str, Any]:
        """The LoRA base store's report once copied, ``unavailable`` with the reason when the copy could not be
        made."""
        return self.weight_transfer_engine.lora.finish_capture()

    def _read_weight_files(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The model's weight files as vLLM's loader reads them, under checkpoint names."""
        from vllm.model_executor.model_loader import get_model_loader

        loader = get_model_loader(self.vllm_config.load_config)
        return loader.get_all_weights(self.vllm_config.model_config, self.model_runner.get_model())
