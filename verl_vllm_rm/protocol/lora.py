"""LoRA adapters on the wire: their names, the one merge arithmetic, and the server's base store as reported.

A LoRA publish may send each adapted module's factors instead of its merged
weight: ``<module>.lora_A.weight`` (``[r, in]``) and ``<module>.lora_B.weight``
(``[out, r]``), in the server's dtype of ``<module>.weight``, plus one scaling per
module in the request body. The server keeps the base weights of the adapted
modules (its *base store*, ``--weight-update-lora-bases``) and computes every
adapted weight from that base and the current adapters on every publish, so
rounding never accumulates over publishes.

:func:`merge_lora_weight` is the only merge arithmetic: the trainer's merged
publish (:mod:`verl_vllm_rm.weight_sync.lora_wire`) and the server's merge call it, so
both sides compute the same function of the same inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

ADAPTER_KINDS = ("A", "B")
LORA_BASES_STATES = ("held", "unavailable", "off")
LORA_BASES_PLACES = ("host", "device", "off")


def adapter_name(module: str, kind: str) -> str:
    """The wire name of one factor of ``module``'s adapter (``kind`` is ``"A"`` or ``"B"``)."""
    if kind not in ADAPTER_KINDS:
        raise ValueError(f"adapter kind must be one of {ADAPTER_KINDS}, got {kind!r}")
    return f"{module}.lora_{kind}.weight"


def split_adapter_name(name: str) -> tuple[str, str] | None:
    """``(module, kind)`` for an adapter wire name, ``None`` for any other tensor name."""
    for kind in ADAPTER_KINDS:
        suffix = f".lora_{kind}.weight"
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], kind
    return None


def merge_lora_weight(w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float,
                      out_dtype: torch.dtype) -> torch.Tensor:
    """``W0 + scaling * B @ A`` computed in fp32 and cast once to ``out_dtype``."""
    return (w0.float() + scaling * (b.float() @ a.float())).to(out_dtype)


@dataclass(frozen=True)
class LoraBases:
    """The server's base store as ``/weight_inventory`` reports it (``lora_bases``).

    ``state``: ``held`` (adapters can be merged on the server), ``unavailable``
    (asked for, but the server could not hold them: ``reason`` says why) or ``off``
    (``--weight-update-lora-bases off``). ``bytes`` is per worker.

    A ``held`` store is ``captured`` once its copy exists: the room is checked at the
    first inventory read, the copy is made at the first publish that carries adapters,
    so a server that never receives one never pays the memory (``bytes`` is then what
    the copy will take).
    """

    state: str
    where: str
    bytes: int = 0
    modules: tuple[str, ...] = ()
    reason: str | None = None
    captured: bool = False
    held_names: frozenset[str] = field(default=frozenset(), compare=False)  # filled by the inventory

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "where": self.where, "bytes": self.bytes, "modules": list(self.modules),
                "reason": self.reason, "captured": self.captured}

    @classmethod
    def from_json(cls, payload: Any) -> "LoraBases":
        """Parse strictly: a server that reports something else is refused by name, not guessed at."""
        keys = {"state", "where", "bytes", "modules", "reason", "captured"}
        if not isinstance(payload, Mapping) or set(payload) != keys:
            raise ValueError(f"bad lora_bases {payload!r}: expected exactly the fields {sorted(keys)}")
        state, where, size = payload["state"], payload["where"], payload["bytes"]
        modules, reason = payload["modules"], payload["reason"]
        if state not in LORA_BASES_STATES:
            raise ValueError(f"bad lora_bases: 'state' must be one of {list(LORA_BASES_STATES)}, got {state!r}")
        if where not in LORA_BASES_PLACES:
            raise ValueError(f"bad lora_bases: 'where' must be one of {list(LORA_BASES_PLACES)}, got {where!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"bad lora_bases: 'bytes' must be a non-negative integer, got {size!r}")
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise ValueError(f"bad lora_bases: 'modules' must be a list of module names, got {modules!r}")
        if reason is not None and not isinstance(reason, str):
            raise ValueError(f"bad lora_bases: 'reason' must be a string or null, got {reason!r}")
        captured = payload["captured"]
        if not isinstance(captured, bool) or (captured and state != "held"):
            raise ValueError(f"bad lora_bases: 'captured' must be a boolean, true only for a held store, got "
                             f"{captured!r} with state {state!r}")
        return cls(state, where, size, tuple(modules), reason, captured)


def adapter_problems(adapters: Mapping[str, Mapping[str, Any]], scaling: Mapping[str, float] | None,
                     bases: LoraBases | None, params: Mapping[str, Any], full_names: set[str]) -> list[str]:
    """What is wrong with the adapters of one update, one message each (empty: they can be merged).

    ``adapters`` maps each module to its factors' specs (``{"A": spec, "B": spec}``), ``params`` the
    inventory's specs by name, ``full_names`` the full tensors the update also sends.
    """
    flag = "--weight-update-lora-bases host|device"
    if adapters and (bases is None or bases.state != "held"):
        why = "it reports no base store" if bases is None else f"its base store is {bases.state}"
        if bases is not None and bases.reason:
            why += f" ({bases.reason})"
        return [f"the update sends LoRA adapters but this server cannot merge them: {why}; start the server "
                f"with {flag} (and room for the bases), or publish merged weights (lora_wire='merged')"]
    scaling = dict(scaling or {})
    problems = []
    held = set(bases.modules) if bases is not None else set()
    for module in sorted(adapters):
        factors = adapters[module]
        missing = [k for k in ADAPTER_KINDS if k not in factors]
        if missing:
            problems.append(f"adapter of {module!r} lacks lora_{missing[0]}: send both factors of every adapted "
                            "module")
            continue
        if module not in held:
            problems.append(f"{module!r} is not among the server's held LoRA bases: publish it merged "
                            "(lora_wire='merged') or send its full weight")
            continue
        base = params[f"{module}.weight"]
        out_dim, in_dim = base.shape
        a, b = factors["A"], factors["B"]
        if len(a.shape) != 2 or len(b.shape) != 2:
            problems.append(f"adapter of {module!r}: lora_A and lora_B must be matrices, got "
                            f"{list(a.shape)} and {list(b.shape)}")
            continue
        if a.shape[1] != in_dim:
            problems.append(f"lora_A of {module!r} is {list(a.shape)} but the base weight is [{out_dim}, {in_dim}]: "
                            f"lora_A must be [r, {in_dim}]")
        if b.shape[0] != out_dim:
            problems.append(f"lora_B of {module!r} is {list(b.shape)} but the base weight is [{out_dim}, {in_dim}]: "
                            f"lora_B must be [{out_dim}, r]")
        if a.shape[0] != b.shape[1] or not 1 <= a.shape[0] <= min(out_dim, in_dim):
            problems.append(f"adapter of {module!r}: lora_A's rank {a.shape[0]} and lora_B's rank {b.shape[1]} "
                            f"must be equal and within [1, {min(out_dim, in_dim)}]")
        for kind, spec in (("A", a), ("B", b)):
            if spec.dtype != base.dtype:
                problems.append(f"lora_{kind} of {module!r} is {spec.dtype} but the server's weight is "
                                f"{base.dtype}: send adapters in the server's dtype")
        if f"{module}.weight" in full_names:
            problems.append(f"{module!r} is sent both as adapters and as a full weight: send one of the two")
        value = scaling.get(module)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            problems.append(f"adapter of {module!r} needs a finite scaling in the body's lora.scaling, got "
                            f"{value!r}")
    extra = sorted(set(scaling) - set(adapters))
    if extra:
        problems.append(f"lora.scaling names modules the update sends no adapters for: {extra}")
    return problems
