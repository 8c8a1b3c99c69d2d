"""What a publish sends: the tensors the training mode changed, under the server's names, checked.

Names are normalised from HF/PEFT/FSDP to the server's checkpoint names; the mode
keeps the head (``head_only``), the LoRA adapters plus the head when the server
holds the base weights, else the merged LoRA modules plus the head and the
siblings that complete each fused module (``lora``), or everything (``full``);
then :meth:`Inventory.check_update` checks names, shapes, whole fused modules and
the size cap. Nothing is gathered here: each entry produces its tensor when its
bucket is packed, in the same sorted order on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.lora import adapter_name
from verl_vllm_rm.protocol.names import RewardModelTrainingMode, is_head, normalize_name, resolve_name
from verl_vllm_rm.protocol.wire import dtype_name
from verl_vllm_rm.weight_sync.lora import find_lora_modules, full_tensor, lora_scalings

StateDictLike = Mapping[str, torch.Tensor] | torch.nn.Module


@dataclass(frozen=True)
class Outgoing:
    """One tensor to send: its spec on the wire and how to produce it (gathered, or merged from LoRA)."""

    spec: ParamSpec
    produce: Callable[[], torch.Tensor]
    gathers: bool = False  # whether ``produce`` makes a new tensor (a gather, a merge), not the model's own


LORA_WIRES = ("auto", "adapters", "merged")


@dataclass(frozen=True)
class Selection:
    """What a publish sends: the items, the adapters' scalings (``None``: no adapter travels), and why a LoRA
    publish sends merged weights when adapters were asked for (``None``: it does not)."""

    items: list[Outgoing]
    lora_scaling: dict[str, float] | None = None
    fallback_reason: str | None = None


def check_lora_wire(lora_wire: str) -> str:
    if lora_wire not in LORA_WIRES:
        raise ValueError(f"lora_wire must be one of {list(LORA_WIRES)}, got {lora_wire!r}")
    return lora_wire


def lora_fallback_reason(inventory: Inventory, lora_wire: str) -> str | None:
    """Why adapters cannot travel to this server (``None``: they can, or merged weights were asked for)."""
    if check_lora_wire(lora_wire) == "merged":
        return None
    bases = inventory.lora_bases
    if bases is None:
        return "the server reports no LoRA base store (a server older than adapters on the wire)"
    if bases.state != "held":
        return f"its LoRA base store is {bases.state}: {bases.reason}"
    return None


def select_update(
    inventory: Inventory,
    state_dict: StateDictLike,
    mode: RewardModelTrainingMode,
    head_patterns: tuple[str, ...],
    max_update_bytes: int | None,
    *,
    lora_scaling: float | Mapping[str, float] | None = None,
    adapter: str = "default",
    lora_wire: str = "merged",
) -> Selection:
    """The checked, sorted tensors a publish in ``mode`` sends; raises ``WeightUpdateRefused``.

    In ``lora`` mode ``lora_wire`` picks what an adapted module sends: ``merged`` its merged weight (with its
    group's siblings), ``adapters`` (or ``auto``, when the server holds the bases) its ``lora_A``/``lora_B``, in
    the server's dtype; a module the server holds no base for (an embedding) still travels merged.
    """
    fallback = lora_fallback_reason(inventory, lora_wire) if mode is RewardModelTrainingMode.LORA else None
    if fallback is not None and lora_wire == "adapters":
        raise WeightUpdateRefused(f"cannot send LoRA adapters: {fallback}; start the server with "
                                  "--weight-update-lora-bases host|device and room for the bases, or publish with "
                                  "lora_wire='merged' (or 'auto')")
    send_adapters = mode is RewardModelTrainingMode.LORA and lora_wire != "merged" and fallback is None
    if isinstance(state_dict, torch.nn.Module):
        if mode is RewardModelTrainingMode.LORA and lora_scaling is None:
            lora_scaling = lora_scalings(state_dict, adapter)
        state_dict = state_dict.state_dict()
    known = inventory.names
    sources: dict[str, Callable[[], torch.Tensor]] = {}
    gathered: set[str] = set()
    meta: dict[str, tuple[tuple[int, ...], str]] = {}
    trained: set[str] = set()
    never_loaded: set[str] = set()  # on torch's meta device: shapes and dtypes, no data to send
    adapters: dict[str, ParamSpec] = {}
    scalings: dict[str, float] = {}
    for raw, tensor in state_dict.items():
        normalized = normalize_name(raw)
        if normalized is None:
            continue
        name = resolve_name(normalized, known)
        sources[name] = lambda t=tensor: full_tensor(t)
        if hasattr(tensor, "full_tensor"):
            gathered.add(name)
        meta[name] = (tuple(tensor.shape), dtype_name(tensor.dtype))
        if tensor.is_meta:
            never_loaded.add(name)
        if ".modules_to_save." in raw or is_head(name, head_patterns):
            trained.add(name)
    if mode is RewardModelTrainingMode.LORA:
        held = set(inventory.lora_bases.modules) if send_adapters else set()
        for module in find_lora_modules(state_dict, lora_scaling, adapter):
            name = resolve_name(normalize_name(module.base), known)
            server_module = name.removesuffix(".weight")
            if server_module in held and not module.embedding:
                for kind, raw in (("A", module.lora_a), ("B", module.lora_b)):
                    wire = adapter_name(server_module, kind)
                    sources[wire] = lambda t=state_dict[raw]: full_tensor(t)
                    if hasattr(state_dict[raw], "full_tensor"):
                        gathered.add(wire)
                    adapters[wire] = ParamSpec(wire, inventory.params[name].dtype, tuple(state_dict[raw].shape))
                    if state_dict[raw].is_meta:
                        never_loaded.add(wire)
                scalings[server_module] = module.scaling
                continue
            sources[name] = lambda m=module: m.merged(state_dict)
            trained.add(name)
            gathered.add(name)
        # a group the server holds needs no sibling sent: the server takes it from its store
        held_names = inventory.lora_bases.held_names if adapters else frozenset()
        selected = [n for n in inventory.complete_groups(n for n in trained if n not in held_names) if n in sources]
        selected += sorted(n for n in trained if n not in known or n in held_names)
    elif mode is RewardModelTrainingMode.HEAD_ONLY:
        selected = [n for n in sources if is_head(n, head_patterns)]
    else:
        selected = list(sources)
    items = []
    for name in sorted(set(selected) | set(adapters)):
        if name in adapters:
            items.append(Outgoing(adapters[name], sources[name], name in gathered))
            continue
        shape, dtype = meta[name]
        server = inventory.params.get(name)
        items.append(Outgoing(ParamSpec(name, server.dtype if server else dtype, shape), sources[name],
                              name in gathered))
    if unsent := sorted(never_loaded & {i.spec.name for i in items}):
        raise WeightUpdateRefused(f"{unsent} are on torch's meta device (never materialised, e.g. built under "
                                  "init_empty_weights and not loaded): load the model's weights before publishing")
    inventory.check_update([i.spec for i in items], mode, head_patterns, max_update_bytes, scaling=scalings or None)
    return Selection(items, scalings or None, fallback if lora_wire == "auto" else None)
