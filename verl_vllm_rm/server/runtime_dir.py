"""A private ``$TMPDIR`` for one server process, removed when the server exits.

vLLM binds its ZMQ IPC sockets at ``$TMPDIR/<uuid4>`` and writes its distributed-init
files as ``$TMPDIR/vllm_dist_*``, and removes neither: a day of tests left over a
thousand of them in /tmp. Torch's compile cache also defaults to a directory under
``$TMPDIR``; it is pinned to its usual place so that every start still reuses it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

from torch._inductor.runtime.cache_dir_utils import default_cache_dir

UNIX_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) on Linux, less the final NUL
SOCKET_NAME_LEN = 36  # vLLM names its sockets with a uuid4
_SAVED = ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")


@contextmanager
def private_tmpdir() -> Iterator[str | None]:
    """Run the body with ``$TMPDIR`` set to a new directory, then remove it and restore the env.

    Yields the directory, or ``None`` (nothing changed) when vLLM's socket paths inside it
    would pass the unix-socket limit: the server must not fail where plain vLLM would start.
    """
    path = tempfile.mkdtemp(prefix="vrm-")
    if len(path) + 1 + SOCKET_NAME_LEN > UNIX_SOCKET_PATH_MAX:
        os.rmdir(path)
        yield None
        return
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
