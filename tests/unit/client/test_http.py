"""``verl_vllm_rm.client.http``: the synchronous and the asynchronous call fail the same way, with the server's words: the in-process tests (no server; those on the real server: tests/integration/client/test_http.py)."""

from __future__ import annotations

import pytest
from http_requests import request_once

from verl_vllm_rm.client.http import HttpError, get_json


def test_unreachable_server_is_a_transient_error_naming_the_url(dead_url):
    for call in (get_json, request_once):
        with pytest.raises(HttpError, match=dead_url) as err:
            call(dead_url + "/health")
        assert err.value.status is None and err.value.unreachable and err.value.transient


@pytest.mark.parametrize("status, transient", [(None, True), (429, True), (500, True), (503, True),
                                               (400, False), (401, False), (404, False), (409, False)])
def test_only_missing_answers_429_and_5xx_are_worth_a_retry(status, transient):
    assert HttpError("http://h/p", "m", status).transient is transient


def test_a_body_that_is_not_json_is_refused_before_sending(dead_url):
    # a lone surrogate is not UTF-8: no server could read it, so no attempt is made (and none retried)
    with pytest.raises(TypeError, match=r"POST .*/score: the request body cannot be written as JSON: .*surrogate"):
        request_once(dead_url + "/score", "POST", {"input": ["\ud800"]})
    with pytest.raises(TypeError, match="cannot be written as JSON"):
        request_once(dead_url + "/score", "POST", {"input": [object()]})


def test_a_free_port_to_listen_on_is_below_the_ephemeral_range_and_above_rays_worker_ports():
    """No outgoing connection (nor another process's ``bind(0)``) can be given it before the caller binds it."""
    import random
    import socket

    from verl_vllm_rm.client.http import LISTEN_PORTS_LOW, ephemeral_range_start, free_port

    ports = {free_port("127.0.0.1", random.Random(seed)) for seed in range(20)}
    assert all(LISTEN_PORTS_LOW <= port < ephemeral_range_start() for port in ports), ports
    assert len(ports) > 1  # random: two callers at once rarely pick the same
    first = random.Random(7).sample(range(LISTEN_PORTS_LOW, ephemeral_range_start()), 1)[0]
    with socket.socket() as taken:  # the first candidate is held: the next one is given
        taken.bind(("127.0.0.1", first))
        assert free_port("127.0.0.1", random.Random(7)) != first


def test_without_room_below_the_ephemeral_range_the_kernel_chooses(monkeypatch):
    from verl_vllm_rm.client import http

    # the node's ip_local_port_range is the machine's, not one test's to change
    monkeypatch.setattr(http, "ephemeral_range_start", lambda: http.LISTEN_PORTS_LOW)
    port = http.free_port("127.0.0.1")
    assert port >= int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])  # the kernel's range
