"""Tests only: hold the copy of the LoRA base store while a file exists, so a test sees what goes on meanwhile.

The server reads ``CAPTURE_HOLD_ENV`` (set only by tests) when a worker starts the copy, on the copy's own thread:
when the file it names exists, the thread touches ``<file>.held`` (the test's event: the copy has begun) and waits
until the test removes the file. Scoring on the engine's loop is unaffected by design; this is how a test shows it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

CAPTURE_HOLD_ENV = "VERL_VLLM_RM_TEST_CAPTURE_HOLD_FILE"
POLL_S = 0.05


def hold_while_asked() -> None:
    """Return at once, unless a test asked to hold the copy: then once its file is gone."""
    path = os.environ.get(CAPTURE_HOLD_ENV)
    if not path or not os.path.exists(path):
        return
    Path(f"{path}.held").touch()
    while os.path.exists(path):
        time.sleep(POLL_S)
