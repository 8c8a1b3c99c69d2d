"""Protected mode: no unauthenticated weight updates on an address other machines can reach.

The loopback decision and the policy are pure (tests/unit/server/test_exposure.py). Here
``python -m verl_vllm_rm.server`` runs itself: the refusal (the process exits before any
engine) and the explicit opt-out (a server on 0.0.0.0 that scores and opens its weight routes);
the other command lines, scoring on 0.0.0.0 without a key among them, are taken up to the engine
in one server-side interpreter (``start_args.before_the_engine``: one vLLM import instead of one a
server process), and a server started without ``--enable-weight-updates`` (the session's) has no
weight route.
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
from start_args import before_the_engine

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
def test_server_refuses_unauthenticated_weight_updates_before_the_engine(tiny_rm):
    """The server process itself: exit code 1 with the message, no engine started, nothing listening."""
    port = free_port()
    args = ["--model", tiny_rm, "--host", "0.0.0.0", "--port", str(port), "--enable-weight-updates"]
    code, out = _run_server(args, {})
    assert code == 1, out[-2000:]
    assert "refusing to start" in out and "--api-key KEY" in out and "--host 127.0.0.1" in out
    assert OPT_OUT_FLAG in out
    assert not [m for m in ENGINE_MARKERS if m in out], out[-2000:]
    assert _port_is_free(port)  # before the engine: no engine line in its output (above), nothing listening


NO_KEY = {"VLLM_API_KEY": None, API_KEY_ENV: None}
SCORING_PORT = 8123  # only parsed: nothing listens
#: what start-up makes of more command lines, up to the engine (the refusal above is where the server exits on
#: them), in one server-side interpreter: name -> (arguments after --model, environment)
START_CASES = {
    "empty-host": (["--host", "", "--enable-weight-updates"], {**NO_KEY, "VLLM_API_KEY": ""}),
    # with a key the same command gets past the check, and is refused later, on the missing model
    "key-VLLM_API_KEY": (["--host", "0.0.0.0", "--enable-weight-updates"], {**NO_KEY, "VLLM_API_KEY": "k"}),
    "key---api-key": (["--host", "0.0.0.0", "--enable-weight-updates", "--api-key", "k"], NO_KEY),
    "data-parallel": (["--host", "127.0.0.1", "--enable-weight-updates", "--data-parallel-size", "2"], NO_KEY),
    # scoring only: past the check, with the warning (the engine would start next)
    "scoring-0000": (["--host", "0.0.0.0", "--port", str(SCORING_PORT)], NO_KEY),
}


@pytest.fixture(scope="module")
def start_refusals(tiny_rm) -> tuple[dict[str, str | None], str]:
    """Each case's exit message (the key cases name a missing model; None: the case got past every check), and
    the interpreter's stderr."""
    models = {name: "/nonexistent-rm" if name.startswith("key-") else tiny_rm for name in START_CASES}
    got, stderr = before_the_engine([["--model", models[name], *argv] for name, (argv, _) in START_CASES.items()],
                                    [], [env for _, env in START_CASES.values()])
    return {name: result[1] if result[:1] == ["exit"] else None for name, result in zip(START_CASES, got)}, stderr


@pytest.mark.server
def test_an_empty_host_is_refused_like_0000(start_refusals):
    message = start_refusals[0]["empty-host"]
    assert message.startswith("verl-vllm-rm: refusing to start: --enable-weight-updates on ")
    assert "--api-key KEY" in message and "--host 127.0.0.1" in message and OPT_OUT_FLAG in message


@pytest.mark.server
@pytest.mark.parametrize("case", ["key-VLLM_API_KEY", "key---api-key"])
def test_a_key_passes_the_check(start_refusals, case):
    messages, stderr = start_refusals
    assert messages[case].startswith("verl-vllm-rm: --model /nonexistent-rm does not exist"), messages[case]
    assert "WARNING: weight updates without an API key" not in stderr


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
def test_scoring_on_0000_without_a_key_starts_with_a_warning(start_refusals):
    """Without --enable-weight-updates a non-loopback bind needs no key: start-up goes on to the engine, saying
    that anyone who reaches the address can score (the bind itself: the opt-out's server above)."""
    messages, stderr = start_refusals
    assert messages["scoring-0000"] is None
    assert f"WARNING: serving on 0.0.0.0:{SCORING_PORT} without an API key" in stderr


@pytest.mark.server
def test_a_server_without_weight_updates_has_no_weight_route(rm_server, texts):
    """The session's server, started without --enable-weight-updates: it scores, and no weight route is there."""
    resp = requests.post(f"{rm_server.url}/score", json={"input": texts[:2]}, timeout=60)
    assert resp.status_code == 200 and len(resp.json()["data"]) == 2
    for path in ("/init_communicator", "/update_param_batch", "/close_communicator"):
        assert requests.post(f"{rm_server.url}{path}", json={}, timeout=30).status_code == 404
    assert requests.get(f"{rm_server.url}/weight_inventory", timeout=30).status_code == 404


@pytest.mark.server
def test_weight_updates_with_data_parallel_engines_are_refused_before_the_engine(start_refusals):
    """vLLM's data-parallel engines would each need a transfer group: refused, naming the replicas instead."""
    message = start_refusals[0]["data-parallel"]
    assert "--enable-weight-updates with --data-parallel-size 2: each data-parallel engine would need" in message
    assert "run that many servers instead, as managed replicas" in message
