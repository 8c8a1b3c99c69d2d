"""LoRA on the worker: its base store's life, and an update's adapters checked and merged from that store.

A LoRA publish may send adapters (:mod:`verl_vllm_rm.protocol.lora`) instead of
merged weights. On each worker :class:`LoraMerge` plans the base store at the
first inventory read (:func:`.lora_bases.plan_lora_bases`, or ``unavailable`` for
quantized weights), copies it at the first update that carries adapters, refuses
received adapters that are not finite before the reload, and turns a staged update
into what the reload loads: each adapted weight merged from the stored base
(:func:`merged_update`), whole module groups, the head as sent. The worker
extension only calls it. Imports torch only, so its units run without vLLM.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from verl_vllm_rm.protocol.inventory import module_key
from verl_vllm_rm.protocol.lora import LoraBases, merge_lora_weight, split_adapter_name
from verl_vllm_rm.server.weights.lora_bases import LoraBaseStore, PendingLoraBases, plan_lora_bases

Staged = list[tuple[str, torch.Tensor]]


def merged_update(store: LoraBaseStore, staged: Iterable[tuple[str, torch.Tensor]], scaling: Mapping[str, float],
                  compute_device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors to load for an update that carries adapters, grouped by vLLM module.

    Each stored group the update touches yields every member: the adapted weights merged from the stored base, its
    other members as staged (when sent in full) or from the store. Staged full tensors outside those groups (the
    head) follow as they are. Every yielded tensor is new or immutable, so vLLM's layerwise loader may keep it
    until the group's layer is complete.
    """
    factors: dict[str, dict[str, torch.Tensor]] = {}
    full: dict[str, torch.Tensor] = {}
    for name, tensor in staged:
        adapter = split_adapter_name(name)
        if adapter is None:
            full[name] = tensor
        else:
            factors.setdefault(adapter[0], {})[adapter[1]] = tensor
    device = compute_device or store.device
    done: set[str] = set()
    touched = [f"{m}.weight" for m in factors] + [n for n in full if n in store.tensors]
    for key in sorted({module_key(n, store.fused_modules) for n in touched}):
        for name in store.groups[key]:
            module = name.removesuffix(".weight")
            if name in full:
                yield name, full[name]
            elif module in factors and name.endswith(".weight"):
                w0 = store.tensors[name]
                a, b = factors[module]["A"].to(device), factors[module]["B"].to(device)
                yield name, merge_lora_weight(w0.to(device), a, b, float(scaling[module]), w0.dtype)
            else:  # a copy: a loader that kept the tensor as the model's own must never alias the store
                yield name, store.tensors[name].to(device, copy=True)
            done.add(name)
    for name in sorted(set(full) - done):
        yield name, full[name]


class LoraMerge:
    """One worker's LoRA side of weight updates: the base store (planned, then captured) and the staged update's
    adapter scalings (``None``: the update carries no adapters)."""

    def __init__(self, loaded_at_ns: int) -> None:
        self.bases: LoraBaseStore | PendingLoraBases | LoraBases | None = None
        self.scaling: dict[str, float] | None = None
        self.loaded_at_ns = loaded_at_ns  # when the worker loaded the checkpoint the store will be read from

    def plan(self, place: str, device: torch.device, fused_modules: Mapping[str, Sequence[str]],
             specs: Sequence[tuple[str, Sequence[int], torch.dtype]], max_bytes: int | None, model_dir: str,
             quantization: str | None) -> None:
        """Plan the store for the weights ``specs`` names, once (the first inventory read)."""
        if self.bases is not None:
            return
        if place != "off" and quantization is not None:
            self.bases = LoraBases("unavailable", place, reason=(
                f"the server's weights are quantized ({quantization}): adapters cannot be merged into them without "
                "re-quantizing"))
            return
        self.bases = plan_lora_bases(place, device, fused_modules, specs, max_bytes, model_dir, self.loaded_at_ns)

    def report(self) -> dict[str, Any]:
        """The store as ``/weight_inventory`` reports it."""
        if self.bases is None:
            # internal: the router reads the inventory (which plans the store) before it asks for the store
            raise RuntimeError("the LoRA base store is reported only after the first inventory read")
        return (self.bases if isinstance(self.bases, LoraBases) else self.bases.report()).to_json()

    def capture(self, read: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> dict[str, Any]:
        """Copy a planned store from what ``read()`` yields (the checkpoint's weights), once; its report."""
        if isinstance(self.bases, PendingLoraBases):
            self.bases = self.bases.capture(read)
        return self.report()

    def check_received(self, staged: Staged) -> None:
        """Refuse adapters that are not finite, before the reload: the old weights keep serving. (The scalings were
        checked with the metadata: JSON carries no NaN or inf.)"""
        if not self.scaling:
            return
        bad = sorted(name for name, tensor in staged
                     if split_adapter_name(name) and tensor.is_floating_point() and not torch.isfinite(tensor).all())
        if bad:
            raise ValueError(f"the update's LoRA adapters are not finite (NaN or inf) in {bad}; nothing was loaded")

    def to_load(self, staged: Staged, device: torch.device) -> tuple[list[str], Iterable[tuple[str, torch.Tensor]]]:
        """The checkpoint names the staged update touches and the tensors to load for it, its adapters merged from
        the store; the staged scalings are used up."""
        scaling, self.scaling = self.scaling, None
        if not scaling:
            return [name for name, _ in staged], staged
        if not isinstance(self.bases, LoraBaseStore):
            # internal: the router refuses adapters unless the inventory reports the store held (and captured)
            raise RuntimeError("an update with LoRA adapters reached a worker without a LoRA base store")
        names = [f"{split[0]}.weight" if (split := split_adapter_name(n)) else n for n, _ in staged]
        return names, merged_update(self.bases, staged, scaling, device)
