"""What a publish may send: the trainer's tensors under the server's names, each produced when its bucket is packed.

Names are normalised from HF/PEFT/FSDP to the server's checkpoint names (LoRA factors
and a ``modules_to_save`` module's ``original_module`` are skipped: the LoRA strategy,
:mod:`.lora_wire`, decides what they become). Nothing is gathered here: an entry's
``produce`` gathers (or merges) its tensor when the transfer packs it, in the same
sorted order on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

import torch

from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.names import is_head, normalize_name, resolve_name
from verl_vllm_rm.protocol.wire import dtype_name

StateDictLike = Mapping[str, torch.Tensor] | torch.nn.Module


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: DTensor shards are all-gathered, plain tensors pass through."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) else tensor


@dataclass(frozen=True)
class Outgoing:
    """One tensor to send: its spec on the wire and how to produce it (gathered, or merged from LoRA)."""

    spec: ParamSpec
    produce: Callable[[], torch.Tensor]
    gathers: bool = False  # whether ``produce`` makes a new tensor (a gather, a merge), not the model's own


@dataclass(frozen=True)
class Selection:
    """What a publish sends: the items, the adapters' scalings (``None``: no adapter travels), and why a LoRA
    publish sends merged weights when adapters were asked for (``None``: it does not)."""

    items: list[Outgoing]
    lora_scaling: dict[str, float] | None = None
    fallback_reason: str | None = None


class ServerNamedTensors:
    """A state dict's tensors under the server's checkpoint names, as :class:`Outgoing` entries.

    ``trained`` names what the training changed beyond doubt in every mode that does not send everything: the
    head (``head_patterns``) and ``modules_to_save``.
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor], inventory: Inventory,
                 head_patterns: tuple[str, ...]) -> None:
        self.state_dict = state_dict
        self.inventory = inventory
        self.entries: dict[str, Outgoing] = {}
        self.trained: set[str] = set()
        self.never_loaded: set[str] = set()  # on torch's meta device: shapes and dtypes, no data to send
        for raw, tensor in state_dict.items():
            if normalize_name(raw) is None:
                continue
            name = self.server_name(raw)
            self.put(name, tensor)
            if ".modules_to_save." in raw or is_head(name, head_patterns):
                self.trained.add(name)

    def server_name(self, raw: str) -> str:
        return resolve_name(normalize_name(raw), self.inventory.names)

    def put(self, name: str, tensor: torch.Tensor, dtype: str | None = None) -> None:
        """Send ``tensor`` as ``name``, in ``dtype`` (default: the server's dtype of ``name``, else its own)."""
        server = self.inventory.params.get(name)
        dtype = dtype or (server.dtype if server else dtype_name(tensor.dtype))
        self.entries[name] = Outgoing(ParamSpec(name, dtype, tuple(tensor.shape)), lambda t=tensor: full_tensor(t),
                                      hasattr(tensor, "full_tensor"))
        if tensor.is_meta:
            self.never_loaded.add(name)

    def produce_as(self, name: str, produce: Callable[[], torch.Tensor]) -> None:
        """Send ``name`` (same spec) as what ``produce`` computes, a tensor of its own (a merge), and count it as
        trained."""
        self.entries[name] = replace(self.entries[name], produce=produce, gathers=True)
        self.trained.add(name)

    def outgoing(self, names: Iterable[str]) -> list[Outgoing]:
        """The entries of ``names``, sorted; refuses any that was never materialised."""
        chosen = sorted(set(names))
        if unsent := sorted(self.never_loaded.intersection(chosen)):
            raise WeightUpdateRefused(f"{unsent} are on torch's meta device (never materialised, e.g. built under "
                                      "init_empty_weights and not loaded): load the model's weights before publishing")
        return [self.entries[name] for name in chosen]
