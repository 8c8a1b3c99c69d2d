"""The orphan check finds an engine-like process whose server is gone, and leaves one with a live server alone."""

from __future__ import annotations

import os
import subprocess
import sys

from process_helpers import orphaned_engines

from verl_vllm_rm.protocol.defaults import SERVER_PID_ENV


def test_a_process_naming_a_dead_server_is_an_orphan_and_a_live_one_is_not():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    orphan = subprocess.Popen(sleeper, env={**os.environ, SERVER_PID_ENV: str(dead.pid)})
    kept = subprocess.Popen(sleeper, env={**os.environ, SERVER_PID_ENV: str(os.getpid())})
    try:
        found = orphaned_engines()
        assert any(f"pid {orphan.pid} " in line for line in found), found
        assert not any(f"pid {kept.pid} " in line for line in found), found
    finally:
        for proc in (orphan, kept):
            proc.kill()
            proc.wait()
