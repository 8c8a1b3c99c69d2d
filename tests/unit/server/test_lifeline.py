"""The engine's lifeline (``server.lifeline``) in process: only an API server that leads its own process group names
itself to the engine's processes, a process counts as gone once it exited (a zombie too), and the plugin starts no
watch in a process the server did not name (the SIGKILL of a whole group: tests/integration/server/)."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from verl_vllm_rm.protocol.defaults import SERVER_PID_ENV
from verl_vllm_rm.server import lifeline


def in_child(lead_a_group: bool) -> str:
    """``mark_server_process()`` in a forked child (its own group's leader, or a member of this one): what it then
    has in ``SERVER_PID_ENV`` (``-`` for nothing), and its pid."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once, running nothing of pytest's
        try:
            if lead_a_group:
                os.setpgid(0, 0)
            os.environ[SERVER_PID_ENV] = "stale"
            lifeline.mark_server_process()
            os.write(write, f"{os.environ.get(SERVER_PID_ENV, '-')} {os.getpid()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        report = f.read()
    os.waitpid(pid, 0)
    return report


def test_a_server_leading_its_group_names_itself_and_any_other_names_no_one():
    named, pid = in_child(lead_a_group=True).split()
    assert named == pid
    assert in_child(lead_a_group=False).split()[0] == "-"  # a server started inside a shell's group: no lifeline


def test_a_process_is_gone_once_it_exited_even_before_it_is_reaped():
    assert not lifeline.gone(os.getpid())
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it exited; not reaped: a zombie
    assert lifeline.gone(child.pid)
    child.wait()
    assert lifeline.gone(child.pid)


@pytest.mark.parametrize("server", [None, "self"], ids=["no server named", "this process is the server"])
def test_no_watch_starts_where_no_other_server_is_named(monkeypatch, server):
    if server is None:
        monkeypatch.delenv(SERVER_PID_ENV, raising=False)
    else:
        monkeypatch.setenv(SERVER_PID_ENV, str(os.getpid()))
    lifeline.register()
    assert not lifeline._started
    assert "verl-vllm-rm-lifeline" not in {t.name for t in threading.enumerate()}
