"""A private ``$TMPDIR`` for one server process, removed when the server exits.

vLLM binds its ZMQ IPC sockets at ``$TMPDIR/<uuid4>`` and writes its distributed-init
files as ``$TMPDIR/vllm_dist_*``, and removes neither: a day of tests left over a
thousand of them in /tmp. Torch's compile cache also defaults to a directory under
``$TMPDIR``; it is pinned to its usual place so that every start still reuses it.

A server killed with SIGKILL (or by the OOM killer) cannot remove its directory, so
each start also removes the directories of servers whose process is gone. The owner
is in ``server.pid`` inside each directory: its pid and pid namespace, so that a
container sharing /tmp never takes a live server of another namespace for dead.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from torch._inductor.runtime.cache_dir_utils import default_cache_dir

UNIX_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) on Linux, less the final NUL
SOCKET_NAME_LEN = 36  # vLLM names its sockets with a uuid4
PREFIX = "vrm-"
PID_FILE = "server.pid"
_SAVED = ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")
logger = logging.getLogger(__name__)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def sweep_dead(base: str) -> list[str]:
    """Remove the private directories under ``base`` whose server process is gone; return them.

    A directory is left alone without a readable ``server.pid`` (being created, or another
    user's) or when its server ran in another pid namespace.
    """
    namespace = _pid_namespace()
    removed = []
    for entry in os.scandir(base):
        if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            pid, owner_namespace = Path(entry.path, PID_FILE).read_text().split(" ", 1)
            pid = int(pid)
        except (OSError, ValueError):
            continue
        if owner_namespace == namespace and not _alive(pid):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


@contextmanager
def private_tmpdir() -> Iterator[str | None]:
    """Run the body with ``$TMPDIR`` set to a new directory, then remove it and restore the env.

    Yields the directory, or ``None`` (nothing changed) when vLLM's socket paths inside it
    would pass the unix-socket limit: the server must not fail where plain vLLM would start.
    """
    for stale in sweep_dead(tempfile.gettempdir()):
        logger.info("removed %s, left behind by a server that was killed", stale)
    path = tempfile.mkdtemp(prefix=PREFIX)
    if len(path) + 1 + SOCKET_NAME_LEN > UNIX_SOCKET_PATH_MAX:
        os.rmdir(path)
        yield None
        return
    Path(path, PID_FILE).write_text(f"{os.getpid()} {_pid_namespace()}")
    saved = {key: os.environ.get(key) for key in _SAVED}
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    os.environ["TMPDIR"] = path
    tempfile.tempdir = None  # gettempdir() caches its first answer
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
