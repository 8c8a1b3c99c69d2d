"""Undo a reload that failed half-way: the touched modules back exactly as they served, or the weights marked lost.

vLLM's layerwise reload (``initialize_layerwise_reload``) moves each touched layer's parameters onto the meta
device, keeping the served tensors aside (``kernel_tensors``); a layer whose weights have all arrived is processed
and its new values are copied into those served tensors. A failure in between (a loader error, memory, a merge)
leaves some layers on meta and others already overwritten. Before the reload, :func:`copy_modules` keeps a host
copy of every tensor of the touched modules, which is cheap for ``head_only`` and LoRA (the head, the adapted
projections) and bounded by ``--weight-update-rollback-max-bytes``; :func:`roll_back` puts the served tensors back
in every layer and copies the saved values into them. Without a copy nothing can be restored exactly, and the
server must refuse to score (see ``server/weights/apply.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch


@dataclass
class ModuleCopy:
    """The served tensors of every layer under the touched modules (the objects), and their values on the host
    (``values`` None: no copy was kept)."""

    tensors: dict[torch.nn.Module, dict[str, torch.Tensor]]
    values: dict[torch.nn.Module, dict[str, torch.Tensor]] | None
    nbytes: int


def _layers(targets: list[torch.nn.Module]) -> list[torch.nn.Module]:
    seen: dict[int, torch.nn.Module] = {}
    for target in targets:
        for layer in target.modules():
            seen.setdefault(id(layer), layer)
    return list(seen.values())


def _served(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    tensors = {n: p for n, p in layer._parameters.items() if p is not None}
    tensors.update({n: b for n, b in layer._buffers.items() if b is not None})
    return tensors


def copy_modules(targets: list[torch.nn.Module], max_bytes: int | None) -> ModuleCopy:
    """The served tensors of ``targets``, with a host copy of their values when they fit in ``max_bytes``
    (None: no limit)."""
    tensors = {layer: _served(layer) for layer in _layers(targets)}
    nbytes = sum(t.numel() * t.element_size() for served in tensors.values() for t in served.values())
    if max_bytes is not None and nbytes > max_bytes:
        return ModuleCopy(tensors, None, nbytes)
    values = {layer: {n: t.detach().to("cpu", copy=True) for n, t in served.items()}
              for layer, served in tensors.items()}
    return ModuleCopy(tensors, values, nbytes)


def roll_back(model: torch.nn.Module, copy: ModuleCopy) -> str | None:
    """Undo a failed layerwise reload of the copied modules; None when they serve exactly their old values again,
    else why not (no copy was kept)."""
    from vllm.model_executor.model_loader.reload.layerwise import (
        LOADING_LAYERS,
        _get_original_loader,
        _place_kernel_tensors,
        get_layerwise_info,
    )

    if hasattr(model, "_original_do_torchao_reload"):
        model._do_torchao_reload = model._original_do_torchao_reload
    for layer, served in copy.tensors.items():
        info = get_layerwise_info(layer)
        if info.kernel_tensors is not None:  # still waiting for weights: its served tensors are aside
            _place_kernel_tensors(layer, info)
        for tensor in served.values():
            if hasattr(tensor, "weight_loader"):
                tensor.weight_loader = _get_original_loader(tensor)
        info.reset()
    LOADING_LAYERS.clear()
    if copy.values is None:
        return (f"the reload failed half-way and no copy of the {copy.nbytes} bytes it touched was kept "
                "(over --weight-update-rollback-max-bytes)")
    with torch.no_grad():
        for layer, served in copy.tensors.items():
            for name, tensor in served.items():
                if getattr(layer, name) is not tensor:
                    # internal: every layer's served tensors were put back above; vLLM's reload changed shape
                    raise RuntimeError(f"rolling back {type(layer).__name__}.{name}: its served tensor was replaced")
                tensor.copy_(copy.values[layer][name])
    return None


#: Tests only: a file whose number N makes the next reload fail after N tensors (read once, then deleted), so a
#: test injects a fault inside a real reload (tests/weight_sync/test_reload_rollback.py).
RELOAD_FAULT_ENV = "VERL_VLLM_RM_TEST_RELOAD_FAULT_FILE"


def with_test_fault(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    path = os.environ.get(RELOAD_FAULT_ENV)
    if not path or not os.path.exists(path):
        return weights
    after = int(open(path).read())
    os.remove(path)

    def faulty() -> Iterator[tuple[str, torch.Tensor]]:
        for i, item in enumerate(weights):
            if i == after:
                break
            yield item
        raise RuntimeError(f"injected reload fault after {after} tensors")

    return faulty()
