"""``pid_alive``: a running process is alive; an exited one is not, whether still a zombie, reaped, or reaped
between its two reads (the fleet's teardown once failed there with ``FileNotFoundError`` on ``/proc/PID/stat``)."""

from __future__ import annotations

import os
import subprocess
import sys

from process_helpers import pid_alive


def test_a_running_process_is_alive_and_an_exited_one_is_not_zombie_or_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert pid_alive(child.pid)
    child.stdin.close()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    assert not pid_alive(child.pid)
    child.wait()  # reaped
    assert not pid_alive(child.pid)


def test_a_process_reaped_between_the_signal_and_the_read_is_not_alive(monkeypatch):
    import builtins

    real_open = builtins.open

    def reaped_meanwhile(path, *args, **kwargs):  # the fault: /proc/PID is gone once the signal got through
        if str(path) == f"/proc/{os.getpid()}/stat":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", reaped_meanwhile)
    assert not pid_alive(os.getpid())
