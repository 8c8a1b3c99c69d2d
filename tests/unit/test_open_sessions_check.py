"""The open-session check fails a run that leaves an aiohttp session open, and only such a run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from repo_paths import SUPPORT


CLOSES = """
    import asyncio
    import aiohttp

    def test_closes():
        async def go():
            async with aiohttp.ClientSession():
                pass
        asyncio.run(go())
"""
LEAKS = """
    def test_leaks():
        async def go():
            return aiohttp.ClientSession()
        asyncio.run(go())
"""


def run_pytest(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    test_file = tmp_path / "test_planted.py"
    test_file.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "open_sessions_check", "-p", "no:cacheprovider", str(test_file)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])},
    )


def test_a_session_left_open_fails_the_run_and_names_its_test(tmp_path):
    result = run_pytest(tmp_path, CLOSES + LEAKS)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    report = result.stdout.split("aiohttp ClientSession(s) left open")[1]
    assert "created by test_planted.py::test_leaks" in report
    assert "test_closes" not in report


def test_a_run_that_closes_its_sessions_passes(tmp_path):
    result = run_pytest(tmp_path, CLOSES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "left open" not in result.stdout
