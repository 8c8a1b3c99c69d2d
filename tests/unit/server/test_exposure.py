"""Protected mode: no unauthenticated weight updates on an address other machines can reach: the in-process tests (no server; those on the real server: tests/integration/server/test_exposure.py)."""

from __future__ import annotations
import socket
import pytest
from verl_vllm_rm.protocol.defaults import API_KEY_ENV
from verl_vllm_rm.server import exposure
from verl_vllm_rm.server.exposure import OPT_OUT_FLAG, ExposureRefused, check_exposure, is_loopback_bind


@pytest.mark.parametrize("host", ["127.0.0.1", "127.255.255.254", "127.8.9.10", "::1", "::ffff:127.0.0.1", "localhost"])
def test_loopback_hosts(host):
    assert is_loopback_bind(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", None, "10.1.2.3", "192.168.0.7", "8.8.8.8", "fe80::1", "::ffff:10.0.0.1",
             "no-such-host.invalid"],
)
def test_non_loopback_hosts(host):
    assert not is_loopback_bind(host)


def test_a_unix_socket_is_loopback_whatever_the_host():
    assert is_loopback_bind("0.0.0.0", uds="/tmp/rm.sock")


@pytest.mark.parametrize(
    "addresses, loopback",
    [(["127.0.0.1"], True), (["127.0.0.1", "127.0.1.1"], True), (["10.0.0.4"], False),
     (["127.0.0.1", "10.0.0.4"], False), ([], False)],
)
def test_a_host_name_is_loopback_only_if_every_address_it_resolves_to_is(monkeypatch, addresses, loopback):
    def fake_getaddrinfo(host, port, family=0, type=0, *args):
        assert host == "rm-host" and family == socket.AF_INET  # vLLM binds a name as IPv4
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

    monkeypatch.setattr(exposure.socket, "getaddrinfo", fake_getaddrinfo)
    assert is_loopback_bind("rm-host") is loopback


def _check(**kw):
    args = dict(host="0.0.0.0", port=8001, uds=None, has_api_key=False, weight_updates=True, opt_out=False)
    return check_exposure(**{**args, **kw})


def test_weight_updates_on_a_non_loopback_bind_without_a_key_are_refused(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ExposureRefused) as refused:
        _check()
    message = str(refused.value)
    assert "--api-key KEY" in message and "--host 127.0.0.1" in message and OPT_OUT_FLAG in message
    assert "0.0.0.0:8001" in message and API_KEY_ENV not in message
    assert isinstance(refused.value, SystemExit)  # exits non-zero with the message on stderr
    with pytest.raises(ExposureRefused, match="every interface"):
        _check(host="")


def test_the_refusal_points_out_the_trainer_side_key_variable(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "k")
    with pytest.raises(ExposureRefused, match=f"\\${API_KEY_ENV} is set, but that is the trainer side's"):
        _check()


@pytest.mark.parametrize(
    "kw", [dict(has_api_key=True), dict(host="127.0.0.1"), dict(host="::1"), dict(uds="/tmp/rm.sock"),
           dict(has_api_key=True, weight_updates=False), dict(host="localhost", weight_updates=False)],
)
def test_a_key_or_a_loopback_bind_starts_silently(kw):
    assert _check(**kw) == []


def test_the_opt_out_starts_with_a_warning():
    [warning] = _check(opt_out=True)
    assert "WARNING" in warning and OPT_OUT_FLAG in warning and "replace the reward model" in warning


def test_scoring_on_a_non_loopback_bind_without_a_key_starts_with_a_warning():
    [warning] = _check(weight_updates=False)
    assert "WARNING" in warning and "without an API key" in warning and "--api-key KEY" in warning
    assert OPT_OUT_FLAG not in warning
