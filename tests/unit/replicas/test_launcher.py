"""Starting and stopping a server from the trainer side (``replicas/launcher.py``) where no server starts: finding the
server environment, a server's log tail, stopping a process that already exited (real starts, and no server
environment at all: tests/integration/replicas/test_launcher.py)."""

from __future__ import annotations

import subprocess
import sys

from verl_vllm_rm.replicas.launcher import RewardServer, find_server_python


def test_the_server_python_is_the_variables_else_the_repos_venv_server(monkeypatch, tmp_path):
    from verl_vllm_rm.replicas import launcher

    monkeypatch.setattr(launcher, "REPO_ROOT", tmp_path)
    monkeypatch.setenv(launcher.SERVER_PYTHON_ENV, "/opt/server/bin/python")
    assert find_server_python() == "/opt/server/bin/python"
    python = tmp_path / ".venv-server" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.setenv(launcher.SERVER_PYTHON_ENV, "")  # set but empty: not a choice
    assert find_server_python() == str(python)


def test_a_servers_log_tail_is_its_last_lines_or_says_there_is_none(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    server = RewardServer("http://127.0.0.1:1", done, log)
    assert server.log_tail(3) == "line 97\nline 98\nline 99"
    assert server.log_tail().splitlines() == [f"line {i}" for i in range(60, 100)]  # 40 lines by default
    server.stop()  # the process already exited: nothing to signal
    assert done.returncode == 0
    assert RewardServer("http://127.0.0.1:1", done, tmp_path / "missing.log").log_tail() == "(no log)"
