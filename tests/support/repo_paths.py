"""Where the tests find the repository and their shared scripts, wherever a test file sits under tests/."""

from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
PACKAGE = REPO / "verl_vllm_rm"
