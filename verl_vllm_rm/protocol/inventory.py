"""The server's parameter inventory and the checks every update must pass.

The inventory lists the checkpoint-format tensors the served model loads (name,
shape, the server's dtype) and the model's fused modules (``qkv_proj`` is built
from ``q_proj``/``k_proj``/``v_proj``). vLLM reloads weights one *module* at a
time; a module that receives only part of its tensors is rebuilt from the part
plus uninitialised memory, so scores go silently wrong (PLATFORM.md). Hence the
rule: an update carries every tensor of each module it touches, or nothing.

The trainer runs :func:`check_update` before any tensor moves and the server runs
it again on the metadata it receives, so a refused update never reaches the model.
Pure Python, shared by both sides.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from verl_vllm_rm.protocol.lora import LoraBases, adapter_problems, split_adapter_name
from verl_vllm_rm.protocol.names import DEFAULT_HEAD_PATTERNS, RewardModelTrainingMode, is_head


# What a weight may be on the wire. Names from the network never reach
# ``getattr(torch, ...)`` unless they are listed here.
ALLOWED_DTYPES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1, "int32": 4, "int64": 8,
}
MAX_NDIM = 8


class WeightUpdateRefused(ValueError):
    """An update that would leave the served model wrong; nothing was sent or changed."""


@dataclass(frozen=True)
class ParamSpec:
    """One tensor on the wire: checkpoint name, dtype name (``"float32"``) and full shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * ALLOWED_DTYPES[self.dtype]

    @classmethod
    def from_json(cls, item: Any) -> "ParamSpec":
        """Parse one metadata entry strictly: a str name, an allowed dtype, a list of non-negative ints."""
        if not isinstance(item, Mapping) or set(item) != {"name", "dtype", "shape"}:
            raise WeightUpdateRefused(f"bad metadata entry {item!r}: each entry is exactly {{name, dtype, shape}}")
        name, dtype, shape = item["name"], item["dtype"], item["shape"]
        if not isinstance(name, str) or not name:
            raise WeightUpdateRefused(f"bad metadata entry {item!r}: 'name' must be a non-empty string")
        if dtype not in ALLOWED_DTYPES:
            raise WeightUpdateRefused(
                f"bad metadata entry for {name!r}: dtype {dtype!r} is not one of {sorted(ALLOWED_DTYPES)}"
            )
        if (
            not isinstance(shape, (list, tuple))
            or len(shape) > MAX_NDIM
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise WeightUpdateRefused(
                f"bad metadata entry for {name!r}: 'shape' must be a list of at most {MAX_NDIM} "
                f"non-negative integers, got {shape!r}"
            )
        return cls(name, dtype, tuple(shape))


def module_key(name: str, fused_modules: Mapping[str, Sequence[str]]) -> str:
    """The vLLM module a checkpoint tensor loads into (``...q_proj.weight`` -> ``...qkv_proj``)."""
    module = name.rpartition(".")[0] or name
    parent, _, leaf = module.rpartition(".")
    for fused, parts in fused_modules.items():
        if leaf in parts:
            return f"{parent}.{fused}" if parent else fused
    return module


class Inventory:
    """What the server can load: built from ``GET /weight_inventory`` (or by the server itself)."""

    def __init__(self, params: Iterable[ParamSpec], fused_modules: Mapping[str, Sequence[str]],
                 lora_bases: LoraBases | None = None):
        self.params: dict[str, ParamSpec] = {p.name: p for p in params}
        self.fused_modules = {k: list(v) for k, v in fused_modules.items()}
        self.names = frozenset(self.params)
        self.groups: dict[str, list[str]] = {}
        for name in sorted(self.params):
            self.groups.setdefault(module_key(name, self.fused_modules), []).append(name)
        self.lora_bases: LoraBases | None = None
        self.set_lora_bases(lora_bases)

    def set_lora_bases(self, lora_bases: LoraBases | None) -> None:
        """Record the server's base store; a held store holds whole groups (siblings and biases too)."""
        if lora_bases is not None and lora_bases.state == "held":
            held = {n for m in lora_bases.modules if f"{m}.weight" in self.names for n in self.group_of(f"{m}.weight")}
            lora_bases = replace(lora_bases, held_names=frozenset(held))
        self.lora_bases = lora_bases

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "params": [p.to_json() for p in self.params.values()],
            "fused_modules": self.fused_modules,
        }
        if self.lora_bases is not None:
            out["lora_bases"] = self.lora_bases.to_json()
        return out

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> "Inventory":
        bases = payload.get("lora_bases")
        return cls([ParamSpec.from_json(p) for p in payload["params"]], payload.get("fused_modules", {}),
                   None if bases is None else LoraBases.from_json(bases))

    def group_of(self, name: str) -> list[str]:
        return self.groups[module_key(name, self.fused_modules)]

    def complete_groups(self, names: Iterable[str]) -> list[str]:
        """Every name of every module that ``names`` touch (used to fill a LoRA update)."""
        out: set[str] = set()
        for name in names:
            out.update(self.group_of(name) if name in self.names else [name])
        return sorted(out)

    def _unknown(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.names), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown parameter {name!r}{hint}"

    def check_update(
        self,
        specs: Sequence[ParamSpec],
        mode: RewardModelTrainingMode | str,
        head_patterns: Iterable[str] = DEFAULT_HEAD_PATTERNS,
        max_bytes: int | None = None,
        scaling: Mapping[str, float] | None = None,
    ) -> None:
        """Raise :class:`WeightUpdateRefused` listing every problem, or return if the update is sound.

        ``max_bytes`` caps the update's total size (the server's ``--weight-update-max-bytes``).
        LoRA adapters (:mod:`verl_vllm_rm.protocol.lora`) are checked against the held bases' shapes, with
        ``scaling`` per adapted module; a group member the base store holds counts as sent.
        """
        mode = RewardModelTrainingMode.parse(mode)
        head_patterns = tuple(head_patterns)
        problems: list[str] = []
        if not specs:
            problems.append("the update is empty: nothing matched the training mode in the given state dict")
        seen: set[str] = set()
        adapters: dict[str, dict[str, ParamSpec]] = {}
        for spec in specs:
            if spec.name in seen:
                problems.append(f"parameter {spec.name!r} appears twice")
            seen.add(spec.name)
            adapter = split_adapter_name(spec.name)
            if adapter is not None and f"{adapter[0]}.weight" in self.names:
                if mode is not RewardModelTrainingMode.LORA:
                    problems.append(f"{spec.name!r} is a LoRA adapter but training_mode is {mode.value}; "
                                    "adapters travel only in training_mode 'lora'")
                adapters.setdefault(adapter[0], {})[adapter[1]] = spec
                continue
            if spec.dtype not in ALLOWED_DTYPES:
                problems.append(f"{spec.name!r} is {spec.dtype}, not one of {sorted(ALLOWED_DTYPES)}")
                continue
            known = self.params.get(spec.name)
            if known is None:
                problems.append(self._unknown(spec.name))
                continue
            if spec.shape != known.shape:
                problems.append(
                    f"{spec.name!r} has shape {list(spec.shape)} but the server's is {list(known.shape)}"
                )
            if spec.dtype != known.dtype:
                problems.append(f"{spec.name!r} is {spec.dtype} but the server's is {known.dtype}")
            if mode is RewardModelTrainingMode.HEAD_ONLY and not is_head(spec.name, head_patterns):
                problems.append(
                    f"{spec.name!r} is a backbone tensor but training_mode is head_only "
                    f"(head patterns {list(head_patterns)}); publish with training_mode 'lora' or 'full'"
                )
        if adapters or scaling:
            problems += adapter_problems(adapters, scaling, self.lora_bases, self.params, seen)
        touched = seen | {f"{m}.weight" for m in adapters}  # an adapter stands for its module's weight
        covered = touched | (self.lora_bases.held_names if adapters and self.lora_bases is not None else frozenset())
        for group in sorted({module_key(n, self.fused_modules) for n in touched & self.names}):
            missing = [n for n in self.groups[group] if n not in covered]
            if missing:
                sent = [n for n in self.groups[group] if n in seen]
                problems.append(
                    f"partial module {group!r}: sends {sent} without {missing}; vLLM reloads whole "
                    "(fused) modules, so send every tensor of the group"
                )
        total = sum(spec.nbytes for spec in specs if spec.dtype in ALLOWED_DTYPES)
        if max_bytes is not None and total > max_bytes:
            problems.append(
                f"the update carries {total} bytes, more than this server's cap of {max_bytes} bytes "
                "(--weight-update-max-bytes); publish fewer tensors or raise the cap"
            )
        if problems:
            raise WeightUpdateRefused("weight update refused: " + "; ".join(problems))
