"""LoRA on the worker: its base store's life, and an update's adapters checked and merged from that store.

A LoRA publish may send adapters (:mod:`verl_vllm_rm.protocol.lora`) instead of
merged weights. On each worker :class:`LoraMerge` plans the base store at the
first inventory read (:func:`.lora_bases.plan_lora_bases`, or ``unavailable`` for
quantized weights), copies it at the first update that carries adapters (on a thread of
its own: a checkpoint read of an 8B model's adapted weights would otherwise hold the
engine's loop, and every score, for its whole length), refuses
received adapters that are not finite before the reload, and turns a staged update
into what the reload loads (:func:`merge_plan`): each adapted weight merged from
the stored base, whole module groups, the head as sent. A tensor computed from the
store is a :class:`FromStore`, which gives the same bits at every call, so the
reload's undo (:mod:`.rollback`) keeps it, holding only the adapter's factors,
instead of a copy of the merged weight. The worker extension only calls it.
Imports torch only, so its units run without vLLM.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch

from verl_vllm_rm.protocol.inventory import module_key
from verl_vllm_rm.protocol.lora import LoraBases, merge_lora_weight, split_adapter_name
from verl_vllm_rm.server.weights.capture_hold import hold_while_asked
from verl_vllm_rm.server.weights.lora_bases import LoraBaseStore, PendingLoraBases, plan_lora_bases

Staged = list[tuple[str, torch.Tensor]]


def merge_plan(store: LoraBaseStore, staged: Iterable[tuple[str, torch.Tensor]], scaling: Mapping[str, float],
               compute_device: torch.device | None = None) -> list[tuple[str, torch.Tensor | FromStore]]:
    """What to load for an update that carries adapters, grouped by vLLM module.

    Each stored group the update touches lists every member: the adapted weights as a :class:`FromStore` that
    merges them from the stored base, its other members as staged (when sent in full) or as a :class:`FromStore`
    copying them from the store. Staged full tensors outside those groups (the head) follow as they are.
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
    plan: list[tuple[str, torch.Tensor | FromStore]] = []
    touched = [f"{m}.weight" for m in factors] + [n for n in full if n in store.tensors]
    for key in sorted({module_key(n, store.fused_modules) for n in touched}):
        for name in store.groups[key]:
            module = name.removesuffix(".weight")
            if name in full:
                plan.append((name, full[name]))
            elif module in factors and name.endswith(".weight"):
                # the factors are copied: the staged ones are reused by the next receive, and a FromStore may be
                # called again later, for an undo
                a, b = (factors[module][k].to(device, copy=True) for k in ("A", "B"))
                plan.append((name, FromStore(store, name, device, a, b, float(scaling[module]))))
            else:
                plan.append((name, FromStore(store, name, device)))
    done = {name for name, _ in plan}
    plan += [(name, full[name]) for name in sorted(set(full) - done)]
    return plan


def computed(plan: Iterable[tuple[str, torch.Tensor | FromStore]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of a :func:`merge_plan`, computed when it is reached. Every yielded tensor is new or immutable,
    so vLLM's layerwise loader may keep it until the group's layer is complete."""
    for name, item in plan:
        yield name, item() if isinstance(item, FromStore) else item


class FromStore:
    """One tensor of a LoRA update computed from the store: ``W0 + scaling * B @ A`` for an adapted weight (with
    ``a`` and ``b``), else a copy of the stored member (a loader that kept the tensor as the model's own must never
    alias the store). The same bits at every call (the store never changes), so a reload can be undone from it
    (a :class:`.served_values.Recipe`): ``nbytes`` is what it holds beyond the store (the factors)."""

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


class LoraMerge:
    """One worker's LoRA side of weight updates: the base store (planned, then captured) and the staged update's
    adapter scalings (``None``: the update carries no adapters)."""

    def __init__(self, loaded_at_ns: int) -> None:
        self.bases: LoraBaseStore | PendingLoraBases | LoraBases | None = None
        self.scaling: dict[str, float] | None = None
        self.loaded_at_ns = loaded_at_ns  # when the worker loaded the checkpoint the store will be read from
        self._copying: threading.Thread | None = None  # the store's copy, under way
        self._copied: LoraBaseStore | LoraBases | None = None

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

    def begin_capture(self, read: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        """Start copying a planned store from what ``read()`` yields (the checkpoint's weights) on a thread of its
        own, and return; nothing to do when it was copied (or found unavailable) before, or a copy is under way."""
        if not isinstance(self.bases, PendingLoraBases) or self._copying is not None:
            return
        pending = self.bases

        def copy() -> None:
            try:
                hold_while_asked()
                self._copied = pending.capture(read)
            except Exception as e:  # what PendingLoraBases.capture does not foresee: reported like what it does
                self._copied = LoraBases("unavailable", pending.place,
                                         reason=f"holding the LoRA bases failed: {type(e).__name__}: {e}")

        self._copying = threading.Thread(target=copy, daemon=True, name="rm-lora-bases-copy")
        self._copying.start()

    def capture_done(self) -> bool:
        return self._copying is None or not self._copying.is_alive()

    def finish_capture(self) -> dict[str, Any]:
        """The store once its copy has ended (waiting for it), as reported."""
        if self._copying is not None:
            self._copying.join()
            self.bases, self._copying, self._copied = self._copied, None, None
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

    def to_load(self, staged: Staged, device: torch.device
                ) -> tuple[list[str], Iterable[tuple[str, torch.Tensor]], dict[str, FromStore]]:
        """The checkpoint names the staged update touches, the tensors to load for it (its adapters merged from the
        store) and, by name, those of them computed from the store (kept by the reload's undo instead of copies);
        the staged scalings are used up."""
        scaling, self.scaling = self.scaling, None
        if not scaling:
            return [name for name, _ in staged], staged, {}
        if not isinstance(self.bases, LoraBaseStore):
            # internal: the router refuses adapters unless the inventory reports the store held (and captured)
            raise RuntimeError("an update with LoRA adapters reached a worker without a LoRA base store")
        names = [f"{split[0]}.weight" if (split := split_adapter_name(n)) else n for n, _ in staged]
        plan = merge_plan(self.bases, staged, scaling, device)
        return names, computed(plan), {name: item for name, item in plan if isinstance(item, FromStore)}
