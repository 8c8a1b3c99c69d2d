"""What a worker serves, in checkpoint format: the values a failed reload is undone from.

vLLM-CPU serves its linears from a handle built from the loaded values by ``process_weights_after_loading``
(a oneDNN or packed-weight GEMM), so the served tensors can neither be read back nor written back: the only exact
undo loads the old checkpoint-format values through the same layerwise reload (``server/weights/rollback.py``).
This module knows those values. A weight no update has replaced serves what the weight files hold (read again
only when an undo needs it, after checking the files were not rewritten since the server loaded them). A weight
an update replaced serves what that update loaded: each reload keeps a host copy of every tensor it loads, adopted
when the reload succeeds; a LoRA merge keeps only its recipe (the adapter's factors: the base store computes the
same bits again). ``--weight-update-rollback-max-bytes`` caps those
copies (default: none, so at most one copy of the model between reloads, and two while a full reload replaces
the copies of an earlier one); a weight replaced past the cap is *unknown*, and an update that fails with one
under its modules cannot be undone: the server's weights are lost.

Imports torch only, so its units run without vLLM.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Mapping, Protocol

import torch

from verl_vllm_rm.server.weights.lora_bases import rewritten_after

CAP_FLAG = "--weight-update-rollback-max-bytes"


class Recipe(Protocol):
    """A tensor computed again, bit for bit, at each call, from what the worker holds anyway (a LoRA merge from
    the base store: ``lora_merge.FromStore``); ``nbytes``: what it holds beyond that."""

    nbytes: int

    def __call__(self) -> torch.Tensor: ...


def _nbytes(value: "torch.Tensor | Recipe") -> int:
    return value.nbytes


class ServedValues:
    """The checkpoint-format values of the replaced weights (``kept``), the replaced weights whose values were
    not kept (``unknown``), and where the others come from (``read_files``: the model's weight files)."""

    def __init__(self, read_files: Callable[[], Iterable[tuple[str, torch.Tensor]]], model_dir: str,
                 loaded_at_ns: int, max_bytes: int | None = None) -> None:
        self.read_files, self.model_dir, self.loaded_at_ns = read_files, model_dir, loaded_at_ns
        self.max_bytes = max_bytes
        self.kept: dict[str, torch.Tensor | Recipe] = {}
        self.unknown: set[str] = set()
        self.pending: dict[str, torch.Tensor | Recipe] = {}
        self.pending_unknown: set[str] = set()
        self.reload_nbytes = 0  # the most the copies held during the last reload: see :meth:`keeping`

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in self.kept.values())

    def keeping(self, weights: Iterable[tuple[str, torch.Tensor]], recipes: Mapping[str, Recipe] | None = None
                ) -> Iterator[tuple[str, torch.Tensor]]:
        """``weights`` as they are, keeping each one's recipe when ``recipes`` has it, else a host copy, while
        they fit under the cap (counting the kept values they will replace as freed); adopted by :meth:`adopt`,
        dropped by :meth:`drop`.

        The values they replace stay kept until the reload succeeds (its undo needs them), so while it runs the
        copies hold the earlier updates' and this one's: ``reload_nbytes``, up to twice the cap. The host memory
        a reload costs, reported with each update (``rollback_host_bytes``)."""
        self.drop()
        used, recipes = self.nbytes, recipes or {}
        self.reload_nbytes = used
        for name, tensor in weights:
            used -= _nbytes(self.kept[name]) if name in self.kept and name not in self.pending else 0
            value = recipes.get(name, tensor)
            if name not in self.pending and (self.max_bytes is None or used + _nbytes(value) <= self.max_bytes):
                self.pending[name] = value if name in recipes else tensor.detach().to("cpu", copy=True)
                used += _nbytes(value)
                self.reload_nbytes += _nbytes(value)
            elif name not in self.pending:
                self.pending_unknown.add(name)
            yield name, tensor

    def adopt(self) -> None:
        """The reload succeeded: what it loaded serves now."""
        for name in self.pending_unknown:
            self.kept.pop(name, None)
        self.unknown = (self.unknown | self.pending_unknown) - self.pending.keys()
        self.kept.update(self.pending)
        self.drop()

    def drop(self) -> None:
        self.pending, self.pending_unknown = {}, set()

    def forget(self, names: Iterable[str]) -> None:
        """These weights' served values are no longer known (a reload that could not be undone)."""
        names = set(names)
        for name in names:
            self.kept.pop(name, None)
        self.unknown |= names
        self.drop()

    def why_not(self, names: Iterable[str]) -> str | None:
        """Why the served values of ``names`` cannot all be had (None: :meth:`values` gives them)."""
        names = set(names)
        unknown = sorted(names & self.unknown)
        if unknown:
            return (f"the served values of {len(unknown)} of them (e.g. {unknown[0]}) were not kept, over {CAP_FLAG} "
                    f"{self.max_bytes}")
        if names - self.kept.keys():
            rewritten = rewritten_after(self.model_dir, self.loaded_at_ns)
            if rewritten:
                return (f"the weight files {rewritten} in {self.model_dir} changed after the server loaded them, so "
                        "the values it serves are not on disk any more")
        return None

    def values(self, names: Iterable[str]) -> list[tuple[str, torch.Tensor]]:
        """The served checkpoint-format value of each of ``names`` (check :meth:`why_not` first): the kept ones,
        the others read from the weight files."""
        names = set(names)
        out = [(name, value if isinstance(value, torch.Tensor) else value())
               for name in sorted(names & self.kept.keys()) for value in (self.kept[name],)]
        from_files = names - self.kept.keys()
        if from_files:
            out += [(name, tensor) for name, tensor in self.read_files() if name in from_files]
        missing = from_files - {name for name, _ in out}
        if missing:
            # internal: every name comes from the server's inventory, which was read from these same files
            raise RuntimeError(f"the weight files lack {sorted(missing)}")
        return out
