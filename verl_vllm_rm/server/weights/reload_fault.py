"""Tests only: a fault injected inside a real reload, so a test sees what a reload failing half-way leaves.

The server reads ``RELOAD_FAULT_ENV`` (set only by tests) at each reload; the file it names holds one number per
line, one line per coming reload (the undo of a failed reload is a reload too): ``N`` makes that reload raise after
N tensors reached vLLM's loader. The first worker process to reload claims the file (an atomic rename to a name of
its own), so of several servers sharing the switch (a fleet's replicas) exactly one takes the faults; its reloads
then take the lines in turn, and the claimed file is deleted when none is left: a test that finds neither file
knows each fault happened inside a reload.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

import torch

RELOAD_FAULT_ENV = "VERL_VLLM_RM_TEST_RELOAD_FAULT_FILE"


def _next_fault() -> int | None:
    path = os.environ.get(RELOAD_FAULT_ENV)
    if not path:
        return None
    mine = Path(f"{path}.claimed-{os.getpid()}")
    if not mine.exists():
        try:
            os.rename(path, mine)
        except FileNotFoundError:  # no fault asked for, or another process claimed it
            return None
    lines = mine.read_text().split()
    if len(lines) > 1:
        mine.write_text("\n".join(lines[1:]))
    else:
        mine.unlink()
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
