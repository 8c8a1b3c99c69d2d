"""The server's LoRA base store: the base weights of the adapted modules, kept to merge adapters into.

With ``--weight-update-lora-bases host|device`` (default ``host``) each worker keeps
an immutable copy, in the served dtype, of every weight of the modules LoRA can
adapt (whole vLLM module groups, biases and unadapted siblings included), read
from the checkpoint files: vLLM-CPU repacks the live weights, so they cannot be
read back. A LoRA publish then sends only the adapters, and each publish rebuilds
every adapted weight from the stored base (:func:`merge_lora_weight`): rounding
never accumulates, and a failed or aborted publish cannot damage the store,
because nothing ever writes to it.

Memory: one copy of the adapted modules' weights per worker, in the served dtype
(all-linear LoRA on an 8B model in bf16: 13.96 GB; see docs/weight_sync.md).
Imports torch only, so its units run without vLLM.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import torch

from verl_vllm_rm.protocol.inventory import module_key
from verl_vllm_rm.protocol.lora import LoraBases, merge_lora_weight, split_adapter_name

PLACE_FLAG = "--weight-update-lora-bases"
CAP_FLAG = "--weight-update-lora-bases-max-bytes"
HOST_MARGIN_BYTES = 1 << 30  # left free on the host (or the device) after the store is allocated


class LoraBaseStore:
    """Immutable copies of base weights by checkpoint name, and the merge of an update's adapters into them."""

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
        return sorted(n.removesuffix(".weight") for n in self.tensors if n.endswith(".weight"))

    def report(self) -> LoraBases:
        return LoraBases("held", self.place, self.nbytes, tuple(self.modules))

    def merged_update(self, staged: Iterable[tuple[str, torch.Tensor]], scaling: Mapping[str, float],
                      compute_device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors to load for an update that carries adapters, grouped by vLLM module.

        Each stored group the update touches yields every member: the adapted weights merged from the stored
        base, its other members as staged (when sent in full) or from the store. Staged full tensors outside those
        groups (the head) follow as they are. Every yielded tensor is new or immutable, so vLLM's layerwise
        loader may keep it until the group's layer is complete.
        """
        factors: dict[str, dict[str, torch.Tensor]] = {}
        full: dict[str, torch.Tensor] = {}
        for name, tensor in staged:
            adapter = split_adapter_name(name)
            if adapter is None:
                full[name] = tensor
            else:
                factors.setdefault(adapter[0], {})[adapter[1]] = tensor
        device = compute_device or self.device
        done: set[str] = set()
        touched = [f"{m}.weight" for m in factors] + [n for n in full if n in self.tensors]
        for key in sorted({module_key(n, self.fused_modules) for n in touched}):
            for name in self.groups[key]:
                module = name.removesuffix(".weight")
                if name in full:
                    yield name, full[name]
                elif module in factors and name.endswith(".weight"):
                    w0 = self.tensors[name]
                    a, b = factors[module]["A"].to(device), factors[module]["B"].to(device)
                    yield name, merge_lora_weight(w0.to(device), a, b, float(scaling[module]), w0.dtype)
                else:  # a copy: a loader that kept the tensor as the model's own must never alias the store
                    yield name, self.tensors[name].to(device, copy=True)
                done.add(name)
        for name in sorted(set(full) - done):
            yield name, full[name]


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


def capture_lora_bases(place: str, device: torch.device, fused_modules: Mapping[str, Sequence[str]],
                       specs: Sequence[tuple[str, Sequence[int], torch.dtype]],
                       read: Callable[[], Iterable[tuple[str, torch.Tensor]]],
                       max_bytes: int | None) -> LoraBaseStore | LoraBases:
    """The store of the tensors ``specs`` names (copied from what ``read()`` yields), or why it cannot be held.

    ``specs`` are the (name, shape, served dtype) of the weights to keep; the room is checked before anything
    is allocated, and an allocation that fails anyway is reported the same way.
    """
    if place == "off":
        return LoraBases("off", "off", reason=f"{PLACE_FLAG} off")
    where = torch.device("cpu") if place == "host" else device
    reason = room_for(needed_bytes(specs), place, where, max_bytes)
    if reason is not None:
        return LoraBases("unavailable", place, reason=reason)
    dtypes = {name: dtype for name, _, dtype in specs}
    store = LoraBaseStore(place, where, fused_modules)
    try:
        for name, tensor in read():
            if name in dtypes:
                store.add(name, tensor, dtypes[name])
    except (RuntimeError, MemoryError) as e:  # an allocation the checks above did not foresee
        return LoraBases("unavailable", place, reason=f"holding the LoRA bases failed: {type(e).__name__}: {e}")
    return store
