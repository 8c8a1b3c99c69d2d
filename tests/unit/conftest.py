"""tests/unit runs in-process: no reward server, no Ray, no ``main_ppo`` (tests/support/unit_guard.py)."""

from __future__ import annotations

import pytest
from unit_guard import nothing_heavy_starts


@pytest.fixture(scope="module", autouse=True)
def in_process_only():
    with nothing_heavy_starts():
        yield
