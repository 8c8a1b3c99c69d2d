"""Training modes and parameter-name normalisation from HF/PEFT/FSDP to the server's names.

A trainer's ``state_dict()`` rarely uses the checkpoint names vLLM loads: PEFT
prefixes ``base_model.model.`` and inserts ``.base_layer``; ``modules_to_save``
keeps a trained copy of the head next to the frozen original; FSDP, DDP and
``torch.compile`` insert wrapper segments; a wrapper that holds the HF model as
``.model`` doubles the ``model.`` prefix. This module maps all of these to the
server's names. Pure Python, shared by the trainer and the server.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from typing import Iterable

DEFAULT_HEAD_PATTERNS: tuple[str, ...] = ("score.*", "classifier.*")

_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_PEFT_TENSOR = re.compile(r"\.(lora_[AB]|lora_embedding_[AB]|lora_magnitude_vector)(\.|$)")
_MODULES_TO_SAVE = re.compile(r"\.modules_to_save\.[^.]+\.")


class RewardModelTrainingMode(str, enum.Enum):
    """Which part of the reward model is trained, hence what a publish sends."""

    HEAD_ONLY = "head_only"
    LORA = "lora"
    FULL = "full"

    @classmethod
    def parse(cls, value: "RewardModelTrainingMode | str") -> "RewardModelTrainingMode":
        try:
            return cls(value)
        except ValueError:
            valid = [m.value for m in cls]
            raise ValueError(f"unknown training_mode {value!r}; use one of {valid}") from None


def is_peft_tensor(name: str) -> bool:
    """LoRA factors and DoRA magnitudes: inputs to a merge, never sent as such."""
    return _PEFT_TENSOR.search(name) is not None


def normalize_name(name: str) -> str | None:
    """Strip wrapper and PEFT segments; ``None`` for tensors that must not be sent.

    ``None`` covers LoRA factors (merged elsewhere) and a ``modules_to_save``
    module's frozen ``original_module`` (the trained copy is the live one).
    """
    if is_peft_tensor(name) or ".original_module." in name:
        return None
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    name = name.removeprefix("module.")
    name = name.removeprefix("base_model.model.")
    name = name.replace(".base_layer.", ".")
    return _MODULES_TO_SAVE.sub(".", name)


def resolve_name(name: str, known: "set[str] | frozenset[str]") -> str:
    """Map a normalised name onto a known server name by fixing the ``model.`` prefix.

    Handles both a duplicated prefix (``model.model.layers...`` from a wrapper
    holding the HF model as ``.model``) and a missing one (a backbone-only state
    dict). An unknown name is returned unchanged, so validation can report it.
    """
    if name in known:
        return name
    candidate = name
    while candidate.startswith("model.model."):
        candidate = candidate.removeprefix("model.")
        if candidate in known:
            return candidate
    if "model." + name in known:
        return "model." + name
    return name


def is_head(name: str, head_patterns: Iterable[str] = DEFAULT_HEAD_PATTERNS) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in head_patterns)
