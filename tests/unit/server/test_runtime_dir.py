"""The server's private $TMPDIR: vLLM's sockets and init files go there and leave with it."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from verl_vllm_rm.server.runtime_dir import PID_FILE, PREFIX, UNIX_SOCKET_PATH_MAX, private_tmpdir


@pytest.fixture()
def base(monkeypatch, short_tmpdir):
    """A fresh $TMPDIR for the code under test (gettempdir() caches, so reset it around the test)."""
    monkeypatch.setenv("TMPDIR", str(short_tmpdir))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    return short_tmpdir


def test_body_runs_in_a_new_dir_that_is_removed_after(base):
    with private_tmpdir() as path:
        assert os.path.dirname(path) == str(base) and os.environ["TMPDIR"] == path
        assert tempfile.gettempdir() == path
        open(os.path.join(path, "vllm_dist_x"), "w").close()  # what vLLM leaves behind
        cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        assert os.path.dirname(cache) == str(base), "torch's compile cache stays where it was"
    assert os.listdir(base) == []
    assert os.environ["TMPDIR"] == str(base) and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    assert tempfile.gettempdir() == str(base)


def test_dir_is_removed_when_the_server_fails(base):
    with pytest.raises(KeyboardInterrupt), private_tmpdir() as path:  # vLLM's SIGTERM handler raises this
        open(os.path.join(path, "sock"), "w").close()
        raise KeyboardInterrupt
    assert not os.path.exists(path)


def test_long_tmpdir_is_left_alone(base, monkeypatch):
    """Where vLLM's socket paths would not fit in the private dir, nothing changes: the server must
    start wherever plain vLLM starts."""
    long_base = base / ("d" * (UNIX_SOCKET_PATH_MAX - len(str(base)) - 45))
    long_base.mkdir()
    monkeypatch.setenv("TMPDIR", str(long_base))
    assert len(str(long_base)) + 37 <= UNIX_SOCKET_PATH_MAX, "plain vLLM would fit here"
    with private_tmpdir() as path:
        assert path is None and os.environ["TMPDIR"] == str(long_base)
    assert os.listdir(long_base) == []


def _dir_of(base, name: str, owner: str | None):
    path = base / f"{PREFIX}{name}"
    path.mkdir()
    (path / "sock").touch()
    if owner is not None:
        (path / PID_FILE).write_text(owner)
    return path


def test_a_start_removes_the_dirs_of_dead_servers_only(base):
    """A SIGKILLed server leaves its directory; the next start removes it, and nothing that may be live."""
    namespace = os.readlink("/proc/self/ns/pid")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = _dir_of(base, "dead", f"{gone.pid} {namespace}")
    live = _dir_of(base, "live", f"{os.getpid()} {namespace}")
    creating = _dir_of(base, "creating", None)
    elsewhere = _dir_of(base, "other-ns", f"{gone.pid} pid:[1]")  # a container sharing /tmp
    with private_tmpdir() as path:
        assert not dead.exists()
        assert live.exists() and creating.exists() and elsewhere.exists()
        assert Path(path, PID_FILE).read_text() == f"{os.getpid()} {namespace}"
    assert sorted(p.name for p in base.iterdir()) == sorted(p.name for p in (live, creating, elsewhere))
