"""Starting the server: failures carry the server's own log, and nothing outlives its starter."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from verl_vllm_rm.server_process import ServerStartError, start_server

LAUNCHER = """
import json, sys
from verl_vllm_rm.server_process import start_server
server = start_server(sys.argv[1], sys.argv[2:])
pids = [server.process.pid] + [c.pid for c in __import__("psutil").Process(server.process.pid).children(recursive=True)]
print(json.dumps({"pids": pids, "url": server.url}), flush=True)
__import__("time").sleep(600)
"""


def test_bad_model_path_fails_fast_with_log(tmp_path):
    with pytest.raises(ServerStartError) as err:
        start_server(tmp_path / "no-such-model", ["--enforce-eager"], startup_timeout_s=300)
    assert "exited with code" in str(err.value)
    assert "no-such-model" in str(err.value)


def test_server_dies_with_its_starter(tiny_rm, server_args):
    """SIGKILL the process that started a server (no cleanup code runs): the server group exits too."""
    starter = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, tiny_rm, *server_args], stdout=subprocess.PIPE, text=True
    )
    try:
        info = json.loads(starter.stdout.readline())
        assert len(info["pids"]) >= 2 and all(psutil.pid_exists(p) for p in info["pids"])
    finally:
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + 60
    alive = info["pids"]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.5)
    assert alive == [], f"orphaned server processes: {alive}"
