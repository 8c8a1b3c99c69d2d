"""Embedding health of the reward model's backbone.

Near-zero rows (never-trained or zeroed tokens) and identical rows (tied or
collapsed tokens) in the input (and, if present, output) embeddings are signs of
a broken checkpoint or a bad resize that a scalar score will not reveal.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EmbeddingReport:
    name: str
    rows: int
    near_zero_rows: list[int]
    identical_row_groups: list[list[int]]

    @property
    def ok(self) -> bool:
        return not self.near_zero_rows and not self.identical_row_groups

    def as_dict(self) -> dict:
        return {"name": self.name, "rows": self.rows, "near_zero_rows": self.near_zero_rows[:50],
                "identical_row_groups": self.identical_row_groups[:50], "ok": self.ok}


def check_matrix(name: str, weight, *, zero_norm: float = 1e-6, identical_tol: float = 0.0,
                 ignore_rows: tuple[int, ...] = ()) -> EmbeddingReport:
    """Rows with L2 norm <= ``zero_norm``, and groups of rows equal within ``identical_tol`` (max abs)."""
    import torch

    w = weight.detach().float()
    keep = torch.ones(w.shape[0], dtype=torch.bool)
    keep[list(ignore_rows)] = False
    norms = w.norm(dim=1)
    near_zero = [i for i in torch.nonzero((norms <= zero_norm) & keep).flatten().tolist()]
    scale = max(identical_tol, 1e-12)
    keys = torch.round(w / scale) if identical_tol > 0 else w
    groups: dict[bytes, list[int]] = {}
    for i in torch.nonzero(keep & (norms > zero_norm)).flatten().tolist():
        groups.setdefault(keys[i].numpy().tobytes(), []).append(i)
    identical = [g for g in groups.values() if len(g) > 1]
    return EmbeddingReport(name, w.shape[0], near_zero, identical)


def embedding_health(model, **kwargs) -> list[EmbeddingReport]:
    reports = [check_matrix("input_embeddings", model.get_input_embeddings().weight, **kwargs)]
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is not None and output.weight is not model.get_input_embeddings().weight:
        reports.append(check_matrix("output_embeddings", output.weight, **kwargs))
    return reports
