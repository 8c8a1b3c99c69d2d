"""The engine's processes end with the API server that started them (a vLLM general plugin).

vLLM's engine core and its workers are children of the API server, in its process group.
When the API server is SIGKILLed (Ray ends a replica actor's child processes that way, and
so does the OOM killer), it cannot stop them, and the engine core does not watch its parent:
they would keep running, a few GB each, serving nobody. vLLM loads its general plugins in
every one of its processes; in the engine processes of a server that leads its own process
group (as the launcher starts it), this one starts a thread that SIGKILLs the group once the
API server is gone. A server started from a shell, inside someone else's group, gets no
lifeline: killing that group could take the shell's other processes with it.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from verl_vllm_rm.protocol.defaults import SERVER_PID_ENV

POLL_S = 1.0
_started = False


def mark_server_process() -> None:
    """Called by the API server before the engine starts: name it to the engine's processes (group leaders only)."""
    if os.getpgrp() == os.getpid():
        os.environ[SERVER_PID_ENV] = str(os.getpid())
    else:
        os.environ.pop(SERVER_PID_ENV, None)


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie has: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False


def register() -> None:
    """The plugin's entry point: in an engine process of a marked server, watch the server."""
    global _started
    server = os.environ.get(SERVER_PID_ENV)
    if _started or not server or int(server) == os.getpid() or os.getpgrp() != int(server):
        return
    _started = True

    def watch(pid: int) -> None:
        while not gone(pid):
            time.sleep(POLL_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, args=(int(server),), daemon=True, name="verl-vllm-rm-lifeline").start()
