"""What a publish sends: the tensors the training mode changed, under the server's names, checked.

Names are normalised from HF/PEFT/FSDP to the server's checkpoint names; the mode
keeps the head (``head_only``), the merged LoRA modules plus the head and the
siblings that complete each fused module (``lora``), or everything (``full``);
then :meth:`Inventory.check_update` checks names, shapes, whole fused modules and
the size cap. Nothing is gathered here: each entry produces its tensor when its
bucket is packed, in the same sorted order on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec
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


def select_update(
    inventory: Inventory,
    state_dict: StateDictLike,
    mode: RewardModelTrainingMode,
    head_patterns: tuple[str, ...],
    max_update_bytes: int | None,
    *,
    lora_scaling: float | Mapping[str, float] | None = None,
    adapter: str = "default",
) -> list[Outgoing]:
    """The checked, sorted list of tensors a publish in ``mode`` sends; raises ``WeightUpdateRefused``."""
    if isinstance(state_dict, torch.nn.Module):
        if mode is RewardModelTrainingMode.LORA and lora_scaling is None:
            lora_scaling = lora_scalings(state_dict, adapter)
        state_dict = state_dict.state_dict()
    known = inventory.names
    sources: dict[str, Callable[[], torch.Tensor]] = {}
    gathered: set[str] = set()
    meta: dict[str, tuple[tuple[int, ...], str]] = {}
    trained: set[str] = set()
    for raw, tensor in state_dict.items():
        normalized = normalize_name(raw)
        if normalized is None:
            continue
        name = resolve_name(normalized, known)
        sources[name] = lambda t=tensor: full_tensor(t)
        if hasattr(tensor, "full_tensor"):
            gathered.add(name)
        meta[name] = (tuple(tensor.shape), dtype_name(tensor.dtype))
        if ".modules_to_save." in raw or is_head(name, head_patterns):
            trained.add(name)
    if mode is RewardModelTrainingMode.LORA:
        for module in find_lora_modules(state_dict, lora_scaling, adapter):
            name = resolve_name(normalize_name(module.base), known)
            sources[name] = lambda m=module: m.merged(state_dict)
            trained.add(name)
            gathered.add(name)
        selected = [n for n in inventory.complete_groups(trained) if n in sources]
        selected += sorted(n for n in trained if n not in known)
    elif mode is RewardModelTrainingMode.HEAD_ONLY:
        selected = [n for n in sources if is_head(n, head_patterns)]
    else:
        selected = list(sources)
    items = []
    for name in sorted(set(selected)):
        shape, dtype = meta[name]
        server = inventory.params.get(name)
        items.append(Outgoing(ParamSpec(name, server.dtype if server else dtype, shape), sources[name],
                              name in gathered))
    inventory.check_update([i.spec for i in items], mode, head_patterns, max_update_bytes)
    return items
