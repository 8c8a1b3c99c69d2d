"""Tests only: a fault injected inside a real reload, so a test sees what a reload failing half-way leaves.

The server reads ``RELOAD_FAULT_ENV`` (set only by tests/weight_sync/test_reload_rollback.py) at each reload; the
file it names holds one number per line, one line per coming reload (the undo of a failed reload is a reload too):
``N`` makes that reload raise after N tensors reached vLLM's loader. Each reload takes its line; the file is
deleted when it has none left, so the test knows the fault happened inside the reload.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

import torch

RELOAD_FAULT_ENV = "VERL_VLLM_RM_TEST_RELOAD_FAULT_FILE"


def _next_fault() -> int | None:
    path = os.environ.get(RELOAD_FAULT_ENV)
    if not path or not os.path.exists(path):
        return None
    lines = Path(path).read_text().split()
    rest = lines[1:]
    if rest:
        Path(path).write_text("\n".join(rest))
    else:
        os.remove(path)
    return int(lines[0]) if lines else None


def with_test_fault(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """``weights``, or (a test asked for it) the first N of them and then an error."""
    after = _next_fault()
    if after is None:
        return weights

    def faulty() -> Iterator[tuple[str, torch.Tensor]]:
        for i, item in enumerate(weights):
            if i == after:
                break
            yield item
        # internal: only a test's RELOAD_FAULT_ENV file reaches it
        raise RuntimeError(f"injected reload fault after {after} tensors")

    return faulty()
