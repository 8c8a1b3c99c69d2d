"""Protected mode: who can reach the server, decided before the engine loads.

Like Redis's protected mode. A server that accepts weight updates on an address
other machines can reach, without an API key, would let anyone on the network
replace the reward model the policy trains against; it refuses to start unless
the operator says, with one flag nobody types by accident, that the network is
isolated. Scoring without a key on such an address starts, with a warning.

Loopback is decided from the address the server will really bind (vLLM binds
``(--host or "", --port)``, or the unix socket ``--uds``): ``127.0.0.0/8``, ``::1``
(also IPv4-mapped), a unix socket, and a host name whose every IPv4 address is
loopback (``localhost``). ``0.0.0.0``, ``::``, an empty host, any other address,
and a name that does not resolve are not. Pure: no vllm, so it is tested alone.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from verl_vllm_rm.protocol.defaults import API_KEY_ENV

OPT_OUT_FLAG = "--dangerously-allow-unauthenticated-weight-updates"


class ExposureRefused(SystemExit):
    """Raised before the engine loads; its message goes to stderr and the exit code is 1."""


def _loopback_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_loopback_host(host: str | None) -> bool:
    """Whether binding ``host`` (vLLM's ``--host``) listens on loopback only."""
    if not host:  # vLLM binds "" (every interface) when --host is empty or unset
        return False
    try:
        return _loopback_ip(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:  # a name: bound as IPv4 (vLLM's socket family for anything but an IPv6 literal)
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(_loopback_ip(ipaddress.ip_address(a)) for a in addresses)


def is_loopback_bind(host: str | None, uds: str | None = None) -> bool:
    """A unix socket (``--uds``, which makes vLLM ignore ``--host``) is local; else the host decides."""
    return bool(uds) or is_loopback_host(host)


def describe_bind(host: str | None, port: int, uds: str | None = None) -> str:
    if uds:
        return f"unix:{uds}"
    if not host:
        return f"every interface (--host '') port {port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_exposure(
    *, host: str | None, port: int, uds: str | None, has_api_key: bool, weight_updates: bool, opt_out: bool
) -> list[str]:
    """The warnings to log at start; raises :class:`ExposureRefused` for unprotected weight updates."""
    if has_api_key or is_loopback_bind(host, uds):
        return []
    where = describe_bind(host, port, uds)
    if weight_updates and not opt_out:
        hint = ""
        if os.environ.get(API_KEY_ENV):
            hint = (f"\n  (${API_KEY_ENV} is set, but that is the trainer side's variable: the server reads "
                    "--api-key or $VLLM_API_KEY)")
        raise ExposureRefused(
            f"verl-vllm-rm: refusing to start: --enable-weight-updates on {where}, an address other machines can "
            "reach, without an API key would let anyone who reaches it replace the reward model. Either\n"
            "  --api-key KEY (or $VLLM_API_KEY): every route but /health and /ping then needs "
            "'Authorization: Bearer KEY'; give the trainer the same key, or\n"
            "  --host 127.0.0.1: loopback only, when the trainer runs on this machine.\n"
            f"On an isolated network you trust entirely, {OPT_OUT_FLAG} starts it anyway." + hint
        )
    if weight_updates:
        return [
            f"verl-vllm-rm: WARNING: weight updates without an API key on {where} ({OPT_OUT_FLAG}): anyone who "
            "can reach this address can replace the reward model and score with it. Use this only on an isolated "
            "network; otherwise set --api-key KEY or bind --host 127.0.0.1."
        ]
    return [
        f"verl-vllm-rm: WARNING: serving on {where} without an API key: anyone who can reach this address can "
        "score with the reward model and use vLLM's routes. Set --api-key KEY (or $VLLM_API_KEY) or bind "
        "--host 127.0.0.1."
    ]
