"""Helpers for tests that look at a server's processes from outside (plain functions)."""

from __future__ import annotations

import os
import time

import psutil


def listening_ip(pid: int, port: int) -> str | None:
    """The address the process ``pid`` (or one of its children) listens on at ``port``; None if none does."""
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        for conn in proc.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                return conn.laddr.ip
    return None


def orphaned_engines() -> list[str]:
    """vLLM engine processes of a reward server whose API server is gone (they carry ``SERVER_PID_ENV``, naming
    it): what a server killed without its process group would leave running."""
    from verl_vllm_rm.protocol.defaults import SERVER_PID_ENV

    out = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            server = proc.environ().get(SERVER_PID_ENV)
            if not server or int(server) == proc.pid:
                continue
            alive = psutil.pid_exists(int(server)) and psutil.Process(int(server)).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            continue
        if not alive:
            out.append(f"pid {proc.pid} ({proc.info['name']}) of server {server}")
    return out


def wait_for_no_orphaned_engines(timeout_s: float = 30.0) -> list[str]:
    """The orphans still there after ``timeout_s`` (each engine process notices its server's end within a second)."""
    deadline = time.monotonic() + timeout_s
    while (left := orphaned_engines()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def pid_alive(pid: int) -> bool:
    """The process runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
            return f.read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):  # gone, or reaped between the signal and the read
        return False


def wait_until(predicate, timeout_s: float, what: str) -> None:
    """Poll ``predicate`` every half second; fail naming ``what`` after ``timeout_s``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.5)


def engine_core_pid(server_pid: int) -> int:
    """The vLLM engine-core process under a reward server (its title ``VLLM::EngineCore``): the process that runs
    the model, apart from the API server that answers HTTP."""
    cores = []
    for proc in psutil.Process(server_pid).children(recursive=True):
        try:
            title = " ".join(proc.cmdline()) + " " + proc.name()
        except psutil.Error:
            continue
        if "EngineCore" in title:
            cores.append(proc.pid)
    assert len(cores) == 1, f"server {server_pid}: engine-core processes {cores}"
    return cores[0]
