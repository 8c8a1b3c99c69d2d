"""One server of this module's own, started the way docs/quickstart.md documents for other set-ups, then killed:

* through ``VERL_VLLM_RM_SERVER_PYTHON`` naming another interpreter (a wrapper that records its use and
  runs the server environment's python);
* with ``VLLM_CPU_KVCACHE_SPACE=1`` (one of the three overrides of the server's 2 GiB CPU KV-cache default),
  read back from vLLM's own ``/metrics``; the session's server shows the engine takes the size the server's
  arguments give it (the default is set there);
* with ``--engine-stall-timeout`` 4 s: its engine core process SIGSTOPped, then SIGCONTed: ``/health`` and
  ``/score`` answer 503 naming the stall within the timeout, a request already waiting for the engine is
  answered after the resume, exactly as before (managed replicas whose engine stalls: tests/integration/replicas/test_fleet.py);
* and last, its engine core process SIGKILLed: ``/health`` must answer 503 with the cause (the server keeps its
  API server up after the engine's death, ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``, so the answer is read whenever
  it comes).

The other two overrides (``--kv-cache-memory-bytes``, ``--gpu-memory-utilization``) are checked on the
server's argument handling in the server environment (no engine start).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from process_helpers import engine_core_pid, wait_until

from verl_vllm_rm.replicas.launcher import SERVER_PYTHON_ENV, find_server_python, start_server

pytestmark = pytest.mark.server  # starts and kills its own server

KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # tiny RM: 2 layers x (K, V) x 2 kv heads x head_dim 32 x fp32
DEFAULT_KV_BYTES = 2 << 30  # docs/concepts.md, "The server": "on CPU a 2 GiB KV cache"
STALL_S = 4.0  # the module server's --engine-stall-timeout
STALL_IDS = [[5, 17, 29, 41, 53], [7, 19, 31]]


def cache_config(url: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` gauge: the KV cache the engine really got."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    labels = re.search(r"^vllm:cache_config_info\{(.*)\} ", text, re.M).group(1)
    return dict(re.findall(r'(\w+)="([^"]*)"', labels))


@pytest.fixture(scope="module")
def own_server(tmp_path_factory, tiny_rm, server_args_default_kv):
    real_python = find_server_python()
    folder = tmp_path_factory.mktemp("server_python")
    marker = folder / "used"
    wrapper = folder / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$@" > {marker}\nexec {real_python} "$@"\n')
    wrapper.chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:  # for this start only: servers started later must not inherit it
        mp.setenv(SERVER_PYTHON_ENV, str(wrapper))
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
        # its API server stays up once the engine died (the last test), so the 503 is read whatever the phase of
        # vLLM's 5 s watchdog, which otherwise shuts it down 0-5 s later (a loaded machine's polls missed that)
        mp.setenv("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
        server = start_server(tiny_rm, [*server_args_default_kv, "--engine-stall-timeout", str(STALL_S)])
    try:
        yield server, marker
    finally:
        server.stop()


def test_server_python_env_names_the_interpreter(own_server, tiny_rm):
    server, marker = own_server
    assert marker.read_text().split()[:4] == ["-m", "verl_vllm_rm.server", "--model", tiny_rm]
    assert requests.get(f"{server.url}/health", timeout=10).json()["status"] == "ok"


def test_the_engine_gets_the_kv_cache_size_the_server_was_given(rm_server, server_args):
    """The session's server, started with ``--kv-cache-memory-bytes``: vLLM's engine holds exactly that many bytes
    and the tokens they fit. The 2 GiB CPU default is that flag set by the server's argument handling when nothing
    else sizes the cache (:func:`test_each_override_turns_the_kv_cache_default_off`), so it reaches the engine the
    same way, without a server of its own (~1 min of make test) or 2 GiB of KV held beside the suite's servers."""
    given = int(server_args[server_args.index("--kv-cache-memory-bytes") + 1])
    config = cache_config(rm_server.url)
    assert config["kv_cache_memory_bytes"] == str(given)
    assert int(config["kv_cache_size_tokens"]) == given // KV_BYTES_PER_TOKEN


def test_vllm_cpu_kvcache_space_overrides_the_default(own_server):
    """The server leaves the KV cache to vLLM's own setting: 1 GiB, not the 2 GiB default."""
    server, _ = own_server
    config = cache_config(server.url)
    assert config["kv_cache_memory_bytes"] == str(1 << 30)
    assert int(config["kv_cache_size_tokens"]) == (1 << 30) // KV_BYTES_PER_TOKEN


CHECK_DEFAULTS = """
import json, os, sys
from verl_vllm_rm.server.entry import apply_reward_defaults, build_parser

out = []
for argv, env in json.loads(sys.argv[1]):
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    os.environ.update(env)
    parser = build_parser()
    args = parser.parse_args(["--model", "m", *argv])
    apply_reward_defaults(args, parser)
    out.append([args.kv_cache_memory_bytes, args.gpu_memory_utilization])
print(json.dumps(out))
"""


def test_each_override_turns_the_kv_cache_default_off():
    cases = [([], {}), (["--kv-cache-memory-bytes", "123456789"], {}), (["--gpu-memory-utilization", "0.5"], {}),
             ([], {"VLLM_CPU_KVCACHE_SPACE": "1"})]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    proc = subprocess.run([find_server_python(), "-c", CHECK_DEFAULTS, json.dumps(cases)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [kv for kv, _ in got] == [DEFAULT_KV_BYTES, 123456789, None, None]
    assert got[2][1] == 0.5



def test_health_counts_what_the_server_scored(own_server):
    """/health's scoring counters (what a fleet reports per replica): answered requests and their inputs, refused
    ones (4xx) apart, and the time spent in them."""
    server, _ = own_server
    before = requests.get(f"{server.url}/health", timeout=10).json()["scoring"]
    assert requests.post(f"{server.url}/score", json={"input": [[1, 2, 3], [4, 5], [6]]}, timeout=60).status_code == 200
    assert requests.post(f"{server.url}/score", json={"input": []}, timeout=60).status_code == 400
    after = requests.get(f"{server.url}/health", timeout=10).json()["scoring"]
    assert after["requests"] - before["requests"] == 1 and after["inputs"] - before["inputs"] == 3
    assert after["refused"] - before["refused"] == 1 and after["failed"] == before["failed"]
    assert after["busy_s"] > before["busy_s"]


def score(url: str, timeout_s: float = 120) -> requests.Response:
    return requests.post(f"{url}/score", json={"input": STALL_IDS}, timeout=timeout_s)


def test_a_stopped_engine_is_a_503_within_the_timeout_and_serves_exactly_when_it_resumes(own_server):
    """Only the engine-core process stopped: the API server lives and vLLM's check_health passes, yet /health and
    /score answer 503 naming the stall; nothing waiting is lost, and after SIGCONT the server serves as before."""
    server, _ = own_server
    url = server.url
    before = score(url).json()["data"]
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    core = engine_core_pid(server.process.pid)
    with ThreadPoolExecutor(1) as pool:
        os.kill(core, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            waiting = pool.submit(score, url)  # sent to the stopped engine: it waits, and is answered after
            health = None

            def unhealthy() -> bool:
                nonlocal health
                health = requests.get(f"{url}/health", timeout=30)
                return health.status_code == 503

            wait_until(unhealthy, STALL_S + 2, "/health answers 503 within --engine-stall-timeout")
            detected = time.monotonic() - stopped
            assert health.json()["error"].startswith("the engine has stalled: "), health.json()
            assert health.json()["error"].endswith(f"(--engine-stall-timeout {STALL_S:g} s)")
            refused = score(url, timeout_s=10)  # the engine is stopped: only an answer that skips it comes back
            assert refused.status_code == 503 and refused.json()["error"]["message"] == health.json()["error"]
            assert not waiting.done()
        finally:
            os.kill(core, signal.SIGCONT)
        resumed = waiting.result(timeout=120)
    assert resumed.status_code == 200 and resumed.json()["data"] == before  # nothing lost, nothing changed
    wait_until(lambda: requests.get(f"{url}/health", timeout=30).status_code == 200, 30, "/health ok again")
    assert score(url).json()["data"] == before
    print(f"ENGINE STALL: /health 503 {detected:.1f} s after the engine stopped (--engine-stall-timeout {STALL_S:g})")


def test_health_is_503_with_the_cause_when_the_engine_dies(own_server):
    """Runs last: SIGKILL the engine core (a real crash, nothing faked). /health must turn from 200 to 503
    naming the cause. By default vLLM's watchdog then shuts the API server down within 5 s (a replica's fleet
    restarts it); this server was started with ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``, so the 503 stays readable."""
    server, _ = own_server
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    os.kill(engine_core_pid(server.process.pid), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        try:
            resp = requests.get(f"{server.url}/health", timeout=5)
        except requests.ConnectionError:
            pytest.fail("the server went away before /health reported the dead engine")
        if resp.status_code != 200:
            break
        assert time.monotonic() < deadline, "/health still says ok 30 s after the engine died"
        time.sleep(0.05)
    assert resp.status_code == 503, resp.text
    body = resp.json()
    assert body["status"] == "error" and body["type"] == "reward_model"
    assert "EngineCore" in body["error"], body
