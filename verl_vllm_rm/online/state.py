"""How much of the RM one rank holds: bytes of parameters, gradients and optimizer state, from the tensors.

A sharded (DTensor) tensor counts its local shard only: what this rank's memory really holds.
Tests compare 1 and 2 ranks with it, and ``benchmarks/bench_online_rm.py`` reports it.
"""

from __future__ import annotations

from typing import Iterable

import torch


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def sharded_state_bytes(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """``params``, ``grads``, ``optimizer`` and their ``total``, in bytes held by this rank."""
    params = list(module.parameters())
    state = [v for s in (optimizer.state.values() if optimizer is not None else ()) for v in s.values()
             if torch.is_tensor(v) and v.dim() > 0]  # Adam's moments; its scalar step counts are not state size
    figures = {"params": local_bytes(params), "grads": local_bytes(p.grad for p in params if p.grad is not None),
               "optimizer": local_bytes(state)}
    return {**figures, "total": sum(figures.values())}
