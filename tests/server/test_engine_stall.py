"""``--engine-stall-timeout`` on a real server: only the vLLM engine-core process is stopped (SIGSTOP), so the API
server lives on and vLLM's ``check_health`` still passes. Within the timeout ``/health`` answers 503 naming the
stall and ``/score`` 503 at once; a request already waiting for the engine is not lost; after SIGCONT the server
serves again, exactly as before. (Replicas whose engine stalls fail over and restart:
tests/replicas/test_fleet.py.)"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from process_helpers import engine_core_pid, wait_until

from verl_vllm_rm.replicas.launcher import running_server

pytestmark = pytest.mark.server
STALL_S = 4.0
IDS = [[5, 17, 29, 41, 53], [7, 19, 31]]


@pytest.fixture(scope="module")
def stall_server(tiny_rm, server_args):
    with running_server(tiny_rm, [*server_args, "--engine-stall-timeout", str(STALL_S)]) as server:
        yield server


def score(url: str, timeout_s: float = 120) -> requests.Response:
    return requests.post(f"{url}/score", json={"input": IDS}, timeout=timeout_s)


def test_a_stopped_engine_is_a_503_within_the_timeout_and_serves_exactly_when_it_resumes(stall_server):
    url = stall_server.url
    before = score(url).json()["data"]
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    core = engine_core_pid(stall_server.process.pid)
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

