"""Protected mode: no unauthenticated weight updates on an address other machines can reach.

The loopback decision and the policy are pure (first half, no server); the second half
runs ``python -m verl_vllm_rm.server`` itself: the refusal (before any engine), the
explicit opt-out, and scoring on 0.0.0.0 without a key.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from process_helpers import listening_ip

from verl_vllm_rm.replicas.launcher import find_server_python, running_server
from verl_vllm_rm.client.http import free_port
from verl_vllm_rm.protocol.defaults import API_KEY_ENV, PARENT_PID_ENV
from verl_vllm_rm.server.exposure import OPT_OUT_FLAG


WEIGHT_FILES_READ = "Loading safetensors checkpoint shards: 100%"  # vLLM's loader, each time it reads them


ENGINE_MARKERS = ("non-default args:", "Initializing a V1 LLM engine", "EngineCore")  # setup_server, then the engine


def _run_server(args: list[str], env_extra: dict[str, str], timeout_s: float = 120.0):
    """Run the server to its exit; (exit code, output). Killed (and the test failed) if it keeps running."""
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", API_KEY_ENV)}
    env.update({PARENT_PID_ENV: str(os.getpid()), **env_extra})
    cmd = [find_server_python(), "-m", "verl_vllm_rm.server", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the server did not exit within {timeout_s:.0f}s; output tail:\n{out.decode()[-2000:]}")
    return proc.returncode, out.decode(errors="replace")


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.server
@pytest.mark.parametrize("host, env", [("0.0.0.0", {}), ("", {"VLLM_API_KEY": ""})], ids=["0.0.0.0", "empty-host"])
def test_server_refuses_unauthenticated_weight_updates_before_the_engine(tiny_rm, host, env):
    port = free_port()
    args = ["--model", tiny_rm, "--host", host, "--port", str(port), "--enable-weight-updates"]
    code, out = _run_server(args, env)
    assert code == 1, out[-2000:]
    assert "refusing to start" in out and "--api-key KEY" in out and "--host 127.0.0.1" in out
    assert OPT_OUT_FLAG in out
    assert not [m for m in ENGINE_MARKERS if m in out], out[-2000:]
    assert _port_is_free(port)  # before the engine: no engine line in its output (above), nothing listening


@pytest.mark.server
@pytest.mark.parametrize("key_args, env", [([], {"VLLM_API_KEY": "k"}), (["--api-key", "k"], {})],
                         ids=["VLLM_API_KEY", "--api-key"])
def test_a_key_passes_the_check(key_args, env):
    """With a key, the same command gets past the check (and fails later, on the missing model)."""
    args = ["--model", "/nonexistent-rm", "--host", "0.0.0.0", "--port", str(free_port()),
            "--enable-weight-updates", *key_args]
    code, out = _run_server(args, env)
    assert code != 0 and "refusing to start" not in out and "/nonexistent-rm" in out
    assert "WARNING: weight updates without an API key" not in out


@pytest.mark.server
def test_the_opt_out_starts_on_0000_with_a_warning_and_open_weight_routes(tiny_rm, server_args, texts):
    args = [*server_args, "--host", "0.0.0.0", "--enable-weight-updates", OPT_OUT_FLAG]
    with running_server(tiny_rm, args) as server:
        log = server.log_path.read_text(errors="replace")
        assert f"WARNING: weight updates without an API key on 0.0.0.0:{server.url.rsplit(':', 1)[1]}" in log
        assert OPT_OUT_FLAG in log
        assert listening_ip(server.process.pid, int(server.url.rsplit(":", 1)[1])) == "0.0.0.0"
        # the weight routes are open: three trainer ranks asking a fresh server for its inventory at once get the
        # same one, which the engine built once (vLLM's loader logs each read of the weight files: one, for the
        # inventory; the LoRA base store of --weight-update-lora-bases host is only planned then, copied at the first
        # publish with adapters)
        loads = server.log_path.read_text(errors="replace").count(WEIGHT_FILES_READ)
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: requests.get(f"{server.url}/weight_inventory", timeout=60), range(3)))
        assert [a.status_code for a in answers] == [200] * 3 and answers[0].json()["params"]
        assert answers[0].json() == answers[1].json() == answers[2].json()
        assert (answers[0].json()["lora_bases"]["state"], answers[0].json()["lora_bases"]["captured"]) == ("held",
                                                                                                        False)
        assert server.log_path.read_text(errors="replace").count(WEIGHT_FILES_READ) == loads + 1
        assert requests.post(f"{server.url}/score", json={"input": texts[:2]}, timeout=60).status_code == 200


@pytest.mark.server
def test_scoring_on_0000_without_a_key_starts_with_a_warning(tiny_rm, server_args, texts):
    with running_server(tiny_rm, [*server_args, "--host", "0.0.0.0"]) as server:
        port = int(server.url.rsplit(":", 1)[1])
        log = server.log_path.read_text(errors="replace")
        assert f"WARNING: serving on 0.0.0.0:{port} without an API key" in log
        assert "weight updates without an API key" not in log
        assert listening_ip(server.process.pid, port) == "0.0.0.0"
        resp = requests.post(f"{server.url}/score", json={"input": texts[:2]}, timeout=60)
        assert resp.status_code == 200 and len(resp.json()["data"]) == 2
        assert requests.get(f"{server.url}/weight_inventory", timeout=30).status_code == 404


@pytest.mark.server
def test_weight_updates_with_data_parallel_engines_are_refused_before_the_engine(tiny_rm):
    """vLLM's data-parallel engines would each need a transfer group: refused, naming the replicas instead."""
    args = ["--model", tiny_rm, "--host", "127.0.0.1", "--port", str(free_port()), "--enable-weight-updates",
            "--data-parallel-size", "2"]
    code, out = _run_server(args, {})
    assert code == 1, out[-2000:]
    assert "--enable-weight-updates with --data-parallel-size 2: each data-parallel engine would need" in out
    assert "run that many servers instead, as managed replicas" in out
    assert not [m for m in ENGINE_MARKERS if m in out], out[-2000:]
