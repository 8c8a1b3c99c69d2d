"""The reload of the modules an update touches, and its undo when it fails half-way.

vLLM's layerwise reload (``vllm/model_executor/model_loader/reload/layerwise.py``) sets each layer under the
targets aside: its served tensors go to ``kernel_tensors``, the layer gets meta tensors whose loaders buffer what
arrives. A layer whose weights have all arrived is materialized, loaded, processed (``process_weights_after_loading``:
on vLLM-CPU the oneDNN or packed-weight handle the linear serves from) and its values are copied into the served
tensors. A failure in between (a loader error, memory, a LoRA merge) leaves some layers set aside on meta and others
already serving new weights. Copying old values back into the served tensors is not enough: the handle a processed
layer serves from is built from the loaded values and is not refreshed by a copy.

:func:`undo` therefore first puts every layer set aside back on its served tensors (:func:`abandon`), then reloads
every weight under the targets through the same layerwise reload, from the values they served before
(:mod:`.served_values`): each layer ends exactly as the old values load and process, bit for bit.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import torch

from verl_vllm_rm.protocol.inventory import module_key
from verl_vllm_rm.server.weights.reload_fault import with_test_fault
from verl_vllm_rm.server.weights.served_values import Recipe, ServedValues


def layerwise_reload(model: torch.nn.Module, targets: list[torch.nn.Module],
                     weights: Iterable[tuple[str, torch.Tensor]], model_config) -> None:
    """Load ``weights`` into ``model`` through vLLM's layerwise reload of ``targets`` (plain ``load_weights``
    fails on CPU once the linears are processed)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    with torch.no_grad():
        for module in targets:
            initialize_layerwise_reload(module)
        model.load_weights(with_test_fault(weights))
        for module in targets:
            finalize_layerwise_reload(module, model_config)


def abandon(targets: list[torch.nn.Module]) -> None:
    """End a layerwise reload of ``targets`` that raised: each layer still set aside serves its own tensors again
    (unprocessed: their old values), no loader stays wrapped, vLLM's per-layer state is cleared. A layer the reload
    had processed keeps its new values: the caller reloads it."""
    from vllm.model_executor.model_loader.reload.layerwise import (
        LOADING_LAYERS,
        _get_original_loader,
        _place_kernel_tensors,
        get_layerwise_info,
    )
    from vllm.model_executor.model_loader.reload.utils import get_layer_tensors

    for target in targets:
        if hasattr(target, "_original_do_torchao_reload"):
            target._do_torchao_reload = target._original_do_torchao_reload
        for layer in target.modules():
            info = get_layerwise_info(layer)
            if info.kernel_tensors is not None:
                _place_kernel_tensors(layer, info)
            for tensor in get_layer_tensors(layer).values():
                if hasattr(tensor, "weight_loader"):
                    tensor.weight_loader = _get_original_loader(tensor)
            info.reset()
    LOADING_LAYERS.clear()


def undo(model: torch.nn.Module, targets: list[torch.nn.Module],
         served: Iterable[tuple[str, torch.Tensor]], model_config) -> None:
    """Undo a layerwise reload of ``targets`` that raised, from ``served``: the values every weight under the
    targets served before it (checkpoint format). Raises if the undo fails too."""
    abandon(targets)
    try:
        layerwise_reload(model, targets, served, model_config)
    except BaseException:
        abandon(targets)
        raise


def reload_targets(model: torch.nn.Module, names: Iterable[str]) -> list[torch.nn.Module]:
    """The modules an update of ``names`` touches, or the whole model when a name maps to no module.

    vLLM's layerwise reload walks every module of what it is given; giving it only the touched modules (the head,
    or the adapted projections) skips the walk over an unchanged backbone (10-30 ms on a 100M model, per update).
    """
    modules = dict(model.named_modules())
    keys = {module_key(name, _fused(model)) for name in names}
    if not keys <= modules.keys():
        return [model]
    return [modules[key] for key in sorted(keys)]


def names_under(model: torch.nn.Module, targets: list[torch.nn.Module], names: Iterable[str]) -> list[str]:
    """Those of the checkpoint ``names`` that load into one of ``targets``."""
    keys = {key for key, module in model.named_modules() if any(module is t for t in targets)}
    if "" in keys:
        return list(names)
    fused = _fused(model)
    return [n for n in names if (key := module_key(n, fused)) in keys or any(key.startswith(f"{k}.") for k in keys)]


def _fused(model: torch.nn.Module) -> dict:
    return dict(getattr(model, "packed_modules_mapping", {}) or {})


class UndoableReload:
    """A worker's reloads of the modules each update touches, each undone exactly should it fail half-way.

    ``checkpoint_names`` (every weight the model loads) is set at the first inventory read, before any update;
    ``lost`` says, after a failed reload, why it could not be undone (None: the old weights serve exactly).
    """

    def __init__(self, read_files: Callable[[], Iterable[tuple[str, torch.Tensor]]], model_dir: str,
                 loaded_at_ns: int) -> None:
        self.served = ServedValues(read_files, model_dir, loaded_at_ns)
        self.checkpoint_names: list[str] = []
        self.lost: str | None = None

    def run(self, model: torch.nn.Module, model_config, names: list[str],
            weights: Iterable[tuple[str, torch.Tensor]], max_bytes: int | None,
            recipes: Mapping[str, Recipe] | None = None) -> None:
        """Load ``weights`` (the checkpoint ``names``) into the modules they touch; raises the reload's error after
        undoing it (or, when it cannot be, setting ``lost``). ``recipes``: how to compute some of the weights
        again (LoRA merges), kept instead of copies."""
        targets = reload_targets(model, names)
        self.served.max_bytes = max_bytes
        try:
            layerwise_reload(model, targets, self.served.keeping(weights, recipes), model_config)
        except BaseException as e:
            self.served.drop()
            self.lost = self._undo(model, model_config, targets, e)
            raise
        self.served.adopt()

    def _undo(self, model: torch.nn.Module, model_config, targets: list[torch.nn.Module],
              error: BaseException) -> str | None:
        under = names_under(model, targets, self.checkpoint_names)
        why = self.served.why_not(under)
        if why is None:
            try:
                undo(model, targets, self.served.values(under), model_config)
                return None
            except BaseException as e:
                why = f"undoing it failed too ({type(e).__name__}: {e})"
        else:
            abandon(targets)
        self.served.forget(under)
        return f"the reload failed half-way ({type(error).__name__}: {error}) and could not be undone: {why}"
