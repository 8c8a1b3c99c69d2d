"""The server's LoRA base store: the base weights of the adapted modules, kept to merge adapters into.

With ``--weight-update-lora-bases host|device`` (default ``host``) each worker keeps
an immutable copy, in the served dtype, of every weight of the modules LoRA can
adapt (whole vLLM module groups, biases and unadapted siblings included), read
from the checkpoint files: vLLM-CPU repacks the live weights, so they cannot be
read back. The room is checked at the first inventory read and the copy made at
the first publish that carries adapters (:class:`PendingLoraBases`), so a run that
publishes the head or full weights never pays for it. A LoRA publish then sends
only the adapters, and each publish rebuilds every adapted weight from the stored
base (:mod:`.lora_merge`): rounding never accumulates, and a failed or
aborted publish cannot damage the store, because nothing ever writes to it.

Memory: one copy of the adapted modules' weights per worker, in the served dtype
(all-linear LoRA on an 8B model in bf16: 13.96 GB; see docs/weight_sync.md).
Imports torch only, so its units run without vLLM.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import torch

from verl_vllm_rm.protocol.inventory import module_key
from verl_vllm_rm.protocol.lora import LoraBases

PLACE_FLAG = "--weight-update-lora-bases"
CAP_FLAG = "--weight-update-lora-bases-max-bytes"
HOST_MARGIN_BYTES = 1 << 30  # left free on the host (or the device) after the store is allocated


def weight_modules(names: Iterable[str]) -> list[str]:
    """The modules of the ``.weight`` tensors among ``names``, sorted."""
    return sorted(n.removesuffix(".weight") for n in names if n.endswith(".weight"))


class LoraBaseStore:
    """Immutable copies of base weights by checkpoint name, grouped by vLLM module (merged from by
    :mod:`.lora_merge`)."""

    def __init__(self, place: str, device: torch.device, fused_modules: Mapping[str, Sequence[str]]) -> None:
        self.place = place
        self.device = device
        self.fused_modules = {k: list(v) for k, v in fused_modules.items()}
        self.tensors: dict[str, torch.Tensor] = {}
        self.groups: dict[str, list[str]] = {}

    def add(self, name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
        """Keep a private copy of ``tensor`` in ``dtype`` (never a view of a checkpoint or model tensor)."""
        copy = tensor.to(device=self.device, dtype=dtype, copy=True)
        if self.place == "host" and self.device.type == "cpu" and torch.cuda.is_available():
            copy = copy.pin_memory()
        self.tensors[name] = copy
        self.groups.setdefault(module_key(name, self.fused_modules), []).append(name)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def modules(self) -> list[str]:
        """The modules adapters may target: each held weight's module."""
        return weight_modules(self.tensors)

    def report(self) -> LoraBases:
        return LoraBases("held", self.place, self.nbytes, tuple(self.modules), captured=True)


def needed_bytes(specs: Iterable[tuple[str, Sequence[int], torch.dtype]]) -> int:
    return sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in specs)


def room_for(needed: int, place: str, device: torch.device, max_bytes: int | None) -> str | None:
    """Why a store of ``needed`` bytes cannot be held (``None``: it can)."""
    if max_bytes is not None and needed > max_bytes:
        return (f"the LoRA bases need {needed} bytes, more than {CAP_FLAG} {max_bytes}; raise the cap or "
                "publish merged weights")
    if place == "device" and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if needed + HOST_MARGIN_BYTES > free:
            return (f"the LoRA bases need {needed} bytes on {device}, {free} bytes free after the KV cache: lower "
                    f"--gpu-memory-utilization (or --kv-cache-memory-bytes) or use {PLACE_FLAG} host")
        return None
    import psutil

    available = psutil.virtual_memory().available
    if needed + HOST_MARGIN_BYTES > available:
        return (f"the LoRA bases need {needed} bytes of host memory, {available} bytes available: free memory, "
                f"use {PLACE_FLAG} device, or {PLACE_FLAG} off")
    return None


WEIGHT_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
CHANGED = ("the bases read from them now would not be the weights it serves: restart the server, or publish merged "
           "weights")


def checkpoint_stamp(model_dir: str) -> dict[str, tuple[int, int]]:
    """``(size, mtime_ns)`` of each weight file of a local checkpoint directory; empty for anything else (a hub
    id: vLLM's cache is not rewritten in place)."""
    root = Path(model_dir)
    if not root.is_dir():
        return {}
    stamp = {}
    for path in sorted(root.iterdir()):
        if path.suffix in WEIGHT_FILE_SUFFIXES:
            stat = path.stat()
            stamp[path.name] = (stat.st_size, stat.st_mtime_ns)
    return stamp


def rewritten_after(model_dir: str, t_ns: int) -> list[str]:
    """The weight files of a local checkpoint directory written after ``t_ns`` (``time.time_ns()``), sorted."""
    return sorted(name for name, (_, mtime_ns) in checkpoint_stamp(model_dir).items() if mtime_ns > t_ns)


class PendingLoraBases:
    """A store with room checked but not yet copied: the copy waits for the first publish that carries adapters,
    so a server that only ever receives full weights or the head never holds one.

    The copy is read from the checkpoint files, later than the server loaded them: ``stamp`` (their sizes and
    times when the store was planned) tells whether they were rewritten since, and then no store is made.
    """

    def __init__(self, place: str, device: torch.device, fused_modules: Mapping[str, Sequence[str]],
                 specs: Sequence[tuple[str, Sequence[int], torch.dtype]], max_bytes: int | None,
                 model_dir: str, stamp: Mapping[str, tuple[int, int]]) -> None:
        self.place, self.device, self.fused_modules = place, device, fused_modules
        self.specs, self.max_bytes = list(specs), max_bytes
        self.model_dir, self.stamp = model_dir, dict(stamp)

    def report(self) -> LoraBases:
        modules = weight_modules(name for name, _, _ in self.specs)
        return LoraBases("held", self.place, needed_bytes(self.specs), tuple(modules))

    def capture(self, read: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> LoraBaseStore | LoraBases:
        """The store of the tensors ``specs`` names, copied from what ``read()`` yields, or why it cannot be held.

        The room is checked again (memory may have gone to something else since the inventory was read), before
        anything is allocated; an allocation or a read that fails anyway is reported the same way.
        """
        if checkpoint_stamp(self.model_dir) != self.stamp:
            return LoraBases("unavailable", self.place, reason=(
                f"the weight files in {self.model_dir} changed after the server read its inventory; {CHANGED}"))
        reason = room_for(needed_bytes(self.specs), self.place, self.device, self.max_bytes)
        if reason is not None:
            return LoraBases("unavailable", self.place, reason=reason)
        dtypes = {name: dtype for name, _, dtype in self.specs}
        store = LoraBaseStore(self.place, self.device, self.fused_modules)
        try:
            for name, tensor in read():
                if name in dtypes:
                    store.add(name, tensor, dtypes[name])
        except (RuntimeError, MemoryError, OSError) as e:  # an allocation (or a read) the checks did not foresee
            return LoraBases("unavailable", self.place,
                             reason=f"holding the LoRA bases failed: {type(e).__name__}: {e}")
        return store


def plan_lora_bases(place: str, device: torch.device, fused_modules: Mapping[str, Sequence[str]],
                    specs: Sequence[tuple[str, Sequence[int], torch.dtype]], max_bytes: int | None,
                    model_dir: str, loaded_at_ns: int) -> PendingLoraBases | LoraBases:
    """The store to capture later for the weights ``specs`` names ((name, shape, served dtype)), or why none can
    be held: ``off``, no room for it now, or weight files rewritten after the server loaded them (at
    ``loaded_at_ns``, ``time.time_ns()``)."""
    if place == "off":
        return LoraBases("off", "off", reason=f"{PLACE_FLAG} off")
    stamp = checkpoint_stamp(model_dir)
    rewritten = rewritten_after(model_dir, loaded_at_ns)
    if rewritten:
        return LoraBases("unavailable", place, reason=(
            f"the weight files {rewritten} in {model_dir} changed after the server loaded them; {CHANGED}"))
    where = torch.device("cpu") if place == "host" else device
    reason = room_for(needed_bytes(specs), place, where, max_bytes)
    if reason is not None:
        return LoraBases("unavailable", place, reason=reason)
    return PendingLoraBases(place, where, fused_modules, specs, max_bytes, model_dir, stamp)
