"""LoRA on the wire, the trainer side: what a LoRA publish sends, and what it does when adapters cannot travel.

A LoRA publish sends each adapted module as its adapters (``lora_A``, ``lora_B`` under
:func:`~verl_vllm_rm.protocol.lora.adapter_name`, in the server's dtype, with the
module's scaling) when the server holds the module's base weights
(``--weight-update-lora-bases``), else as its merged weight ``W + s * B @ A`` with
the siblings that complete its fused module; the head and ``modules_to_save``
travel in full either way. ``lora_wire`` (``auto``, ``adapters``, ``merged``)
decides, and :class:`LoraWire` carries out the fallback: warned once per reason,
and one merged offer when a server refuses adapters because its store became
unavailable since it was read.

The merge is a pure function of the state dict (``W``, ``A``, ``B``) and each
module's scaling, computed beside the training model: PEFT's ``merge_adapter()``
writes into the base layer and must be undone before the adapters train on, and a
crash in between corrupts the run. Tensors are read through
:func:`~.outgoing.full_tensor`, which gathers FSDP/DTensor shards (a collective:
every trainer rank must call it in the same order).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

import torch

from verl_vllm_rm.protocol.inventory import Inventory, WeightUpdateRefused
from verl_vllm_rm.protocol.lora import LoraBases, adapter_name, merge_lora_weight
from verl_vllm_rm.weight_sync.outgoing import Selection, ServerNamedTensors, full_tensor

LORA_WIRES = ("auto", "adapters", "merged")
_LORA_A = re.compile(r"^(?P<module>.+)\.lora_(?P<kind>embedding_A|A)\.(?P<adapter>[^.]+)(\.weight)?$")

Answer = TypeVar("Answer")


# -- the adapted modules of a PEFT state dict -----------------------------------------------------

@dataclass(frozen=True)
class LoraModule:
    """One adapted module in raw state-dict names; ``merged()`` computes its new weight."""

    module: str
    base: str
    lora_a: str
    lora_b: str
    scaling: float
    embedding: bool

    def merged(self, state_dict: Mapping[str, torch.Tensor]) -> torch.Tensor:
        base = full_tensor(state_dict[self.base])
        b = full_tensor(state_dict[self.lora_b])
        a = full_tensor(state_dict[self.lora_a])
        if self.embedding:  # PEFT's embedding factors are stored transposed: the delta is (B @ A).T = A.T @ B.T
            a, b = b.T, a.T
        return merge_lora_weight(base, a, b, self.scaling, base.dtype)


def lora_scalings(model: torch.nn.Module, adapter: str = "default") -> dict[str, float]:
    """Each LoRA module's scaling (``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA), read from PEFT."""
    out = {}
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and adapter in scaling:
            out[name] = float(scaling[adapter])
    return out


def find_lora_modules(
    state_dict: Mapping[str, torch.Tensor],
    scaling: float | Mapping[str, float] | None,
    adapter: str = "default",
) -> list[LoraModule]:
    """Every module carrying adapter ``adapter`` in ``state_dict``, with its merge inputs."""
    if any(".lora_magnitude_vector." in k for k in state_dict):
        raise ValueError("DoRA adapters (lora_magnitude_vector) are not supported: train the adapters with "
                         "LoraConfig(use_dora=False), or merge them yourself and publish in training_mode 'full'")
    scaling_of: Callable[[str], float | None]
    if isinstance(scaling, Mapping):
        scaling_of = scaling.get
    else:
        scaling_of = lambda _module: scaling  # noqa: E731
    modules = []
    for key in sorted(state_dict):
        match = _LORA_A.match(key)
        if match is None or match["adapter"] != adapter:
            continue
        module, embedding = match["module"], match["kind"] == "embedding_A"
        lora_b = key.replace(f".lora_{match['kind']}.", ".lora_embedding_B." if embedding else ".lora_B.")
        base = next((b for b in (f"{module}.base_layer.weight", f"{module}.weight") if b in state_dict), None)
        s = scaling_of(module)
        missing = [name for name, present in ((lora_b, lora_b in state_dict),
                                              (f"{module}.base_layer.weight", base is not None)) if not present]
        if missing:
            raise ValueError(f"LoRA module {module!r} has {key!r} but the state dict lacks {missing}: publish the "
                             "PEFT model's whole state dict (each adapted module's base weight, lora_A and lora_B)")
        if s is None:
            raise ValueError(
                f"no LoRA scaling for {module!r}: pass the PEFT model itself to publish(), or "
                "lora_scaling=alpha/r (a float, or a dict keyed by module name)"
            )
        modules.append(LoraModule(module, base, key, lora_b, float(s), embedding))
    return modules


# -- adapters or merged weights -------------------------------------------------------------------

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


@dataclass(frozen=True)
class LoraSelection:
    """A LoRA publish's names (full tensors and adapters, among the tensors' entries), the adapters' scalings
    (``None``: none travel) and why merged weights travel where adapters were asked for."""

    names: list[str]
    scaling: dict[str, float] | None
    fallback_reason: str | None


def select_lora(tensors: ServerNamedTensors, lora_wire: str, scaling: float | Mapping[str, float] | None,
                adapter: str = "default") -> LoraSelection:
    """What a LoRA publish sends of ``tensors``: each adapted module's adapters when the server holds its base
    (``lora_wire`` ``adapters``, or ``auto`` with a held store), else its merged weight and the siblings that complete
    its fused module; plus the head and ``modules_to_save``. A module the server holds no base for (an embedding)
    travels merged. Raises ``WeightUpdateRefused`` for ``adapters`` to a server without bases."""
    inventory = tensors.inventory
    fallback = lora_fallback_reason(inventory, lora_wire)
    if fallback is not None and lora_wire == "adapters":
        raise WeightUpdateRefused(f"cannot send LoRA adapters: {fallback}; start the server with "
                                  "--weight-update-lora-bases host|device and room for the bases, or publish with "
                                  "lora_wire='merged' (or 'auto')")
    held = set(inventory.lora_bases.modules) if lora_wire != "merged" and fallback is None else set()
    scalings: dict[str, float] = {}
    adapters: list[str] = []
    for module in find_lora_modules(tensors.state_dict, scaling, adapter):
        name = tensors.server_name(module.base)
        server_module = name.removesuffix(".weight")
        if server_module in held and not module.embedding:
            for kind, raw in (("A", module.lora_a), ("B", module.lora_b)):
                adapters.append(adapter_name(server_module, kind))
                tensors.put(adapters[-1], tensors.state_dict[raw], inventory.params[name].dtype)
            scalings[server_module] = module.scaling
        else:
            tensors.produce_as(name, lambda m=module: m.merged(tensors.state_dict))
    # a group the server holds needs no sibling sent: the server takes it from its store
    held_names = inventory.lora_bases.held_names if scalings else frozenset()
    full = [n for n in tensors.trained if n not in held_names]
    names = [n for n in inventory.complete_groups(full) if n in tensors.entries]
    names += [n for n in tensors.trained if n not in inventory.names or n in held_names]
    return LoraSelection(names + adapters, scalings or None, fallback)


# -- a publisher's fallback -----------------------------------------------------------------------

class LoraWire:
    """A publisher's ``lora_wire`` and its fallback to merged weights, never silent.

    ``auto`` sends adapters where the server holds its base store, else merged weights with one WARNING per reason
    (later ones at INFO); ``adapters`` refuses merged weights; ``merged`` always sends them. A server may refuse
    adapters it was believed to take (its store's copy, made at the first publish with adapters, failed): with
    ``auto`` the same version is then offered once more, merged. Two offers at most.
    """

    def __init__(self, lora_wire: str, server_url: str, log: logging.Logger) -> None:
        self.wire = check_lora_wire(lora_wire)
        self.server_url = server_url
        self.log = log
        self.warned: set[str] = set()

    def offer(self, plan: Callable[[], Selection], announce: Callable[[Selection], Answer],
              bases_now: Callable[[], LoraBases], *, leader: bool = True) -> tuple[Selection, Answer]:
        """``plan()`` the update and ``announce`` it (which raises ``WeightUpdateRefused`` on a refusal); the
        selection and the answer. ``bases_now()`` asks the server for its store after a refusal of adapters and
        records the answer, so the second ``plan()`` sends merged weights. Only the ``leader`` warns."""
        selection = self._planned(plan, leader)
        try:
            return selection, announce(selection)
        except WeightUpdateRefused:
            if selection.lora_scaling is None or self.wire != "auto" or bases_now().state == "held":
                raise
        merged = self._planned(plan, leader)  # bases_now recorded the store as not held: merged weights
        return merged, announce(merged)

    def _planned(self, plan: Callable[[], Selection], leader: bool) -> Selection:
        selection = plan()
        if selection.fallback_reason is not None and leader:
            self.warn(selection.fallback_reason)
        return selection

    def warn(self, reason: str) -> None:
        """Warn once per reason that a LoRA publish sends merged weights; later ones log at INFO."""
        log = self.log.info if reason in self.warned else self.log.warning
        self.warned.add(reason)
        log("%s cannot merge LoRA adapters (%s): publishing merged weights instead; start the server with "
            "--weight-update-lora-bases host|device (and room for the bases) to send only the adapters",
            self.server_url, reason)
