"""Merged LoRA weights, computed beside the training model rather than inside it.

PEFT's ``merge_adapter()`` writes ``W + s * B @ A`` into the base layer and must be
undone before the adapters train on; a crash in between corrupts the run. Here
the merge is a pure function of the state dict (``W``, ``A``, ``B``) and each
module's scaling, so the training model is never touched. Tensors are read
through :func:`full_tensor`, which gathers FSDP/DTensor shards (a collective:
every trainer rank must call it in the same order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from verl_vllm_rm.protocol.lora import merge_lora_weight

_LORA_A = re.compile(r"^(?P<module>.+)\.lora_(?P<kind>embedding_A|A)\.(?P<adapter>[^.]+)(\.weight)?$")


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: DTensor shards are all-gathered, plain tensors pass through."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) else tensor


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
