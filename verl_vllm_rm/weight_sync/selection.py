"""What a publish sends: the tensors the training mode changed, under the server's names, checked.

The mode picks among the state dict's tensors (:mod:`.outgoing`): the head
(``head_only``), everything (``full``), or what the LoRA strategy chooses
(``lora``, :mod:`.lora_wire`: adapters or merged modules, plus the head); then
:meth:`Inventory.check_update` checks names, shapes, whole fused modules and the
size cap, before anything is gathered.
"""

from __future__ import annotations

from typing import Mapping

import torch

from verl_vllm_rm.protocol.inventory import Inventory
from verl_vllm_rm.protocol.names import RewardModelTrainingMode, is_head
from verl_vllm_rm.weight_sync.lora_wire import lora_scalings, select_lora
from verl_vllm_rm.weight_sync.outgoing import Selection, ServerNamedTensors, StateDictLike


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

    ``lora_scaling`` (read from the model itself when it is not given), ``adapter`` and ``lora_wire`` serve the
    ``lora`` mode: see :func:`~.lora_wire.select_lora`.
    """
    lora = mode is RewardModelTrainingMode.LORA
    if isinstance(state_dict, torch.nn.Module):
        if lora and lora_scaling is None:
            lora_scaling = lora_scalings(state_dict, adapter)
        state_dict = state_dict.state_dict()
    tensors = ServerNamedTensors(state_dict, inventory, head_patterns)
    if lora:
        chosen = select_lora(tensors, lora_wire, lora_scaling, adapter)
        names, scaling, fallback = chosen.names, chosen.scaling, chosen.fallback_reason
    elif mode is RewardModelTrainingMode.HEAD_ONLY:
        names, scaling, fallback = [n for n in tensors.entries if is_head(n, head_patterns)], None, None
    else:
        names, scaling, fallback = list(tensors.entries), None, None
    items = tensors.outgoing(names)
    inventory.check_update([i.spec for i in items], mode, head_patterns, max_update_bytes, scaling=scaling)
    return Selection(items, scaling, fallback)
