"""Starting the server: failures carry the server's own log, and nothing outlives its starter."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from verl_vllm_rm.replicas.launcher import ServerStartError, start_server

pytestmark = pytest.mark.server  # starts its own servers

LAUNCHER = """
import json, sys
from verl_vllm_rm.replicas.launcher import start_server
server = start_server(sys.argv[1], sys.argv[2:])
pids = [server.process.pid] + [c.pid for c in __import__("psutil").Process(server.process.pid).children(recursive=True)]
print(json.dumps({"pids": pids, "url": server.url}), flush=True)
__import__("time").sleep(600)
"""


def leftovers(tmpdir) -> list[str]:
    """What servers left in their $TMPDIR, less what is meant to stay: the starter's logs (for
    post-mortems) and torch's compile cache (one directory, reused by every start)."""
    kept = ("verl-vllm-rm-server-", "torchinductor_")
    return sorted(p.name for p in tmpdir.iterdir() if not p.name.startswith(kept))


def test_bad_model_path_fails_fast_with_log(tmp_path):
    """A --model path that is not there: the server exits saying so (vLLM alone would read it as a malformed hub
    id), and the launcher's error carries the server's last lines."""
    missing = tmp_path / "no-such-model"
    with pytest.raises(ServerStartError) as err:
        start_server(missing, ["--enforce-eager"], startup_timeout_s=300)
    assert "server exited with code 1" in str(err.value)
    assert f"verl-vllm-rm: --model {missing} does not exist: give the folder of a local checkpoint" in str(err.value)


def test_no_server_environment_is_a_clear_error(monkeypatch, tmp_path, tiny_rm):
    """Neither ``VERL_VLLM_RM_SERVER_PYTHON`` nor ``.venv-server`` in the repo: starting a server, from Python
    or with ``verl-vllm-rm serve``, says how to get one instead of failing on a missing file. (The variable's
    use is tested on a real start in ``tests/integration/server/test_server_lifecycle.py``.)"""
    from verl_vllm_rm import cli
    from verl_vllm_rm.replicas import launcher as server_launcher

    monkeypatch.delenv(server_launcher.SERVER_PYTHON_ENV, raising=False)
    monkeypatch.setattr(server_launcher, "REPO_ROOT", tmp_path)
    needle = (r"no server environment found: set VERL_VLLM_RM_SERVER_PYTHON to a python that has vllm and "
              rf"verl-vllm-rm installed, or run `make setup` \(`make setup DEVICE=gpu` on GPUs\) to create {tmp_path}/\.venv-server")
    with pytest.raises(ServerStartError, match=needle):
        start_server(tiny_rm)

    def no_exec(path, argv):
        raise AssertionError(f"serve would run {path} {argv}")

    monkeypatch.setattr(cli.os, "execv", no_exec)  # a regression must fail here, not replace pytest
    with pytest.raises(ServerStartError, match=needle):
        cli.main(["serve", "--model", tiny_rm])


def test_server_dies_with_its_starter(tiny_rm, server_args, short_tmpdir):
    """SIGKILL the process that started a server (no cleanup code runs): the server group exits
    too, and takes vLLM's IPC sockets and init files out of $TMPDIR with it."""
    tmpdir = short_tmpdir
    starter = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, tiny_rm, *server_args],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmpdir)),
    )
    try:
        info = json.loads(starter.stdout.readline())
        assert len(info["pids"]) >= 2 and all(psutil.pid_exists(p) for p in info["pids"])
        running = leftovers(tmpdir)
        assert len(running) == 1 and running[0].startswith("vrm-"), running
        assert any(p.is_socket() for p in (tmpdir / running[0]).iterdir()), "vLLM's sockets go in there"
    finally:
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
    deadline = time.monotonic() + 60
    alive = info["pids"]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.5)
    assert alive == [], f"orphaned server processes: {alive}"
    assert leftovers(tmpdir) == []
