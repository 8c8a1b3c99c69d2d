"""``/init_communicator`` towards a trainer address that never answers: an error naming the documented bound
(``min(timeout_s, --weight-update-join-timeout)`` + 1 s), not before it, scoring meanwhile, nothing half-open
after. No upper limit on the time is asserted (a loaded machine is slow): the 504 naming the bound is the event,
and without the server's bound the 300 s join would outlast the request's 120 s timeout and fail the test.

The address is a socket on 127.0.0.1 that listens but never accepts: the kernel completes the TCP
handshake, nothing ever answers (torch's TCPStore client would wait for it forever).
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import requests

from sync_helpers import assert_parity, load_rm, max_diff, reset_server, runtime_version, server_scores

DEFAULT_JOIN_BOUND_S = 30.0  # --weight-update-join-timeout's default (docs/weight_sync.md, docs/security.md)


@contextmanager
def silent_listener():
    """A port on 127.0.0.1 that completes TCP handshakes (backlog) and never accepts or speaks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock


@contextmanager
def scoring_in_background(url: str, probe: list[list[int]]):
    """Score ``probe`` in a loop on a thread; yields the list of (status, seconds) it fills."""
    records: list[tuple[int, float]] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                status = requests.post(f"{url}/score", json={"input": probe}, timeout=120).status_code
            except requests.RequestException:
                status = -1
            records.append((status, time.monotonic() - t0))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield records
    finally:
        stop.set()
        thread.join(130)


def init_communicator(url: str, port: int, timeout_s: float) -> tuple[requests.Response, float]:
    body = {"master_address": "127.0.0.1", "master_port": port, "session": f"silent-{port}", "timeout_s": timeout_s}
    t0 = time.monotonic()
    resp = requests.post(f"{url}/init_communicator", json=body, timeout=120)
    return resp, time.monotonic() - t0


def assert_closed_by_server(listener: socket.socket) -> None:
    """The server's half-open connection was shut down: accepting it now reads its bytes, then EOF."""
    listener.settimeout(10)
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(10)
        while conn.recv(4096):  # socket.timeout here: the server still holds the connection open
            pass


def test_a_shorter_timeout_s_shortens_the_bound(ws_server, probe_ids):
    before = server_scores(ws_server.url, probe_ids)
    with silent_listener() as listener:
        port = listener.getsockname()[1]
        resp, seconds = init_communicator(ws_server.url, port, timeout_s=2)
        assert resp.status_code == 504, resp.text
        assert f"127.0.0.1:{port} did not complete the join within 2 s" in resp.json()["error"]["message"]
        assert seconds >= 2  # not given up early; which bound ended it, the message says (no duration asserted)
        assert_closed_by_server(listener)
    assert max_diff(server_scores(ws_server.url, probe_ids), before) <= 1e-5


def test_a_silent_trainer_address_times_out_while_scoring_goes_on(ws_server, tiny_rm, probe_ids):
    url = ws_server.url
    version, before = runtime_version(url), server_scores(url, probe_ids)
    with silent_listener() as listener, scoring_in_background(url, probe_ids[:2]) as records:
        port = listener.getsockname()[1]
        # the publisher's default timeout_s (300): the server's own bound must cut it short
        resp, seconds = init_communicator(url, port, timeout_s=300)
        during = list(records)
        assert resp.status_code == 504, resp.text
        message = resp.json()["error"]["message"]
        assert f"127.0.0.1:{port} did not complete the join within {DEFAULT_JOIN_BOUND_S:g} s" in message
        assert "--weight-update-join-timeout" in message
        assert seconds >= DEFAULT_JOIN_BOUND_S  # the server's bound ended it (300 s would outlast requests' 120 s)
        assert_closed_by_server(listener)
    # scoring never waited for the join: every request answered, and many of them while the join was under way
    assert len(during) >= 10 and {status for status, _ in during} == {200}, during[:5]
    # nothing changed and nothing is half-open: old weights serve, a normal publish joins and applies
    assert requests.get(f"{url}/health", timeout=10).json()["status"] == "ok"
    assert runtime_version(url) == version and max_diff(server_scores(url, probe_ids), before) <= 1e-5
    new_version = reset_server(url, tiny_rm)
    assert runtime_version(url) == new_version > version
    assert_parity(url, load_rm(tiny_rm), probe_ids)
