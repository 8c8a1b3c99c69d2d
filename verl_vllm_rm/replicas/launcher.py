"""Start and stop one ``python -m verl_vllm_rm.server`` process from the trainer side.

The server runs in its own environment (``.venv-server``: vllm pins a transformers
range that verl does not accept), so it is always a separate process. It is started
in a new process group, told to exit if its parent dies, and stopped as a group, so
neither a failing test nor a crashed demo leaves an engine behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Iterator, Sequence

from verl_vllm_rm.client.http import HttpError, free_port, get_json
from verl_vllm_rm.protocol.defaults import PARENT_PID_ENV

SERVER_PYTHON_ENV = "VERL_VLLM_RM_SERVER_PYTHON"

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServerStartError(RuntimeError):
    pass


def find_server_python() -> str:
    """The interpreter of the server environment: $VERL_VLLM_RM_SERVER_PYTHON, else ./.venv-server."""
    explicit = os.environ.get(SERVER_PYTHON_ENV)
    if explicit:
        return explicit
    candidate = REPO_ROOT / ".venv-server" / "bin" / "python"
    if candidate.exists():
        return str(candidate)
    raise ServerStartError(
        f"no server environment found: set {SERVER_PYTHON_ENV} to a python that has vllm and "
        f"verl-vllm-rm installed, or run `make setup` (`make setup DEVICE=gpu` on GPUs) to create {candidate.parent.parent}"
    )


@dataclass
class RewardServer:
    """A running server process; ``url`` is ``http://HOST:PORT``."""

    url: str
    process: subprocess.Popen
    log_path: Path
    startup_s: float = 0.0
    args: list[str] = field(default_factory=list)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            os.killpg(self.process.pid, signal.SIGCONT)  # a stopped (SIGSTOP) server acts on SIGTERM only once resumed
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=grace_s)
        except ProcessLookupError:
            pass


def start_server(
    model: str | Path,
    extra_args: Sequence[str] = (),
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    python: str | None = None,
    startup_timeout_s: float = 600.0,
    log_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
) -> RewardServer:
    """Launch the server on ``host`` and block until ``/health`` answers ok (or raise with the log tail); ``env``:
    more environment variables for the server (e.g. vLLM's ``VLLM_CPU_OMP_THREADS_BIND``)."""
    port = port or free_port(host)
    log = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="verl-vllm-rm-server-", suffix=".log")[1])
    cmd = [python or find_server_python(), "-m", "verl_vllm_rm.server", "--model", str(model),
           "--host", host, "--port", str(port)]
    cmd += list(extra_args)
    env = dict(os.environ, **(env or {}), **{PARENT_PID_ENV: str(os.getpid())})
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = RewardServer(f"http://{host}:{port}", proc, log, args=cmd)
    try:
        while True:
            if proc.poll() is not None:
                raise ServerStartError(f"server exited with code {proc.returncode}; log tail:\n{server.log_tail()}")
            if time.monotonic() - t0 > startup_timeout_s:
                raise ServerStartError(f"server not healthy after {startup_timeout_s:g}s (startup_timeout_s; "
                                       "replicas.startup_timeout_s for managed replicas): raise it if the model "
                                       f"loads slowly here, else see why in the log tail:\n{server.log_tail()}")
            try:
                if get_json(server.url + "/health", timeout_s=2.0).get("status") == "ok":
                    break
            except HttpError:  # not up yet
                pass
            time.sleep(0.5)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - t0
    return server


@contextmanager
def running_server(model: str | Path, extra_args: Sequence[str] = (), **kwargs) -> Iterator[RewardServer]:
    server = start_server(model, extra_args, **kwargs)
    try:
        yield server
    finally:
        server.stop()
