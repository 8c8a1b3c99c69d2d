"""The server's private $TMPDIR: vLLM's sockets and init files go there and leave with it."""

import os
import tempfile

import pytest

from verl_vllm_rm.server.runtime_dir import UNIX_SOCKET_PATH_MAX, private_tmpdir


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
