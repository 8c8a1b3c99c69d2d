"""The server's LoRA base store: the base weights of the adapted modules, kept to merge adapters into.

With ``--weight-update-lora-bases host|device`` (default ``host``) each worker keeps
an immutable copy, in the served dtype, of every weight of the modules LoRA can
adapt (whole vLLM module groups, biases and unadapted siblings included), read
from the checkpoint files: vLLM-CPU repacks the live weights, so they cannot be
read back. The room is checked at the first inventory read and the copy made at
the first publish that carries adapters (:class:`PendingLoraBases`), so a run that
publishes the head or full weights never pays for it. A LoRA publish then sends
only the adapters, and each publish rebuilds every adapted weight from the stored
base (:func:`merge_lora_weight`): rounding never accumulates, and a failed or
aborted publish cannot damage the store, because nothing ever writes to it.

Memory: one copy of the adapted modules' weights per worker, in the served dtype
(all-linear LoRA on an 8B model in bf16: 13.96 GB; see docs/weight_sync.md).
Imports torch only, so its units run without vLLM.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import torch

from verl_vllm_rm.protocol.inventory import module_key
from verl_vllm_rm.protocol.lora import LoraBases, merge_lora_weight, split_adapter_name

PLACE_FLAG = "--weight-update-lora-bases"
CAP_FLAG = "--weight-update-lora-bases-max-bytes"
HOST_MARGIN_BYTES = 1 << 30  # left free on the host (or the device) after the store is allocated


def weight_modules(names: Iterable[str]) -> list[str]:
    """The modules of the ``.weight`` tensors among ``names``, sorted."""
    return sorted(n.removesuffix(".weight") for n in names if n.endswith(".weight"))


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
        return weight_modules(self.tensors)

    def report(self) -> LoraBases:
        return LoraBases("held", self.place, self.nbytes, tuple(self.modules), captured=True)

    def merge_plan(self, staged: Iterable[tuple[str, torch.Tensor]], scaling: Mapping[str, float],
                   compute_device: torch.device | None = None) -> list[tuple[str, "torch.Tensor | FromStore"]]:
        """What to load for an update that carries adapters, grouped by vLLM module: each staged full tensor as it
        is, and for every stored group the update touches each member as a :class:`FromStore`, computed when
        called (the adapted weights merged from the stored base, the others copied from the store)."""
        factors: dict[str, dict[str, torch.Tensor]] = {}
        full: dict[str, torch.Tensor] = {}
        for name, tensor in staged:
            adapter = split_adapter_name(name)
            if adapter is None:
                full[name] = tensor
            else:
                factors.setdefault(adapter[0], {})[adapter[1]] = tensor
        device = compute_device or self.device
        plan: list[tuple[str, torch.Tensor | FromStore]] = []
        touched = [f"{m}.weight" for m in factors] + [n for n in full if n in self.tensors]
        for key in sorted({module_key(n, self.fused_modules) for n in touched}):
            for name in self.groups[key]:
                module = name.removesuffix(".weight")
                if name in full:
                    plan.append((name, full[name]))
                elif module in factors and name.endswith(".weight"):
                    # the factors are copied: the staged ones are reused by the next receive, a FromStore may be
                    # called again for an undo later
                    a, b = (factors[module][k].to(device, copy=True) for k in ("A", "B"))
                    plan.append((name, FromStore(self, name, device, a, b, float(scaling[module]))))
                else:
                    plan.append((name, FromStore(self, name, device)))
        done = {name for name, _ in plan}
        plan += [(name, full[name]) for name in sorted(set(full) - done)]
        return plan

    def merged_update(self, staged: Iterable[tuple[str, torch.Tensor]], scaling: Mapping[str, float],
                      compute_device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors of :meth:`merge_plan`, each computed when it is reached. Every yielded tensor is new or
        immutable, so vLLM's layerwise loader may keep it until the group's layer is complete."""
        return computed(self.merge_plan(staged, scaling, compute_device))


def computed(plan: Iterable[tuple[str, "torch.Tensor | FromStore"]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of a :meth:`LoraBaseStore.merge_plan`, computed when it is reached."""
    for name, item in plan:
        yield name, item() if isinstance(item, FromStore) else item


class FromStore:
    """One tensor of a LoRA update computed from the store: ``W0 + scaling * B @ A`` for an adapted weight (with
    ``a`` and ``b``), else a copy of the stored member (a loader that kept the tensor as the model's own must never
    alias the store). The same bits at every call (the store never changes), so a reload can be undone from it:
    ``nbytes`` is what it holds beyond the store (the factors)."""

    def __init__(self, store: LoraBaseStore, name: str, device: torch.device, a: torch.Tensor | None = None,
                 b: torch.Tensor | None = None, scaling: float = 0.0) -> None:
        self.store, self.name, self.device = store, name, device
        self.a, self.b, self.scaling = a, b, scaling

    @property
    def nbytes(self) -> int:
        return 0 if self.a is None else self.a.nbytes + self.b.nbytes

    def __call__(self) -> torch.Tensor:
        w0 = self.store.tensors[self.name]
        if self.a is None:
            return w0.to(self.device, copy=True)
        return merge_lora_weight(w0.to(self.device), self.a, self.b, self.scaling, w0.dtype)


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
