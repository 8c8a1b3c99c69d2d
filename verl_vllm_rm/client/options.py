"""How the trainer side talks to a server: the options every client section shares.

``reward_kwargs`` (each reward model) and its ``judge`` section extend :class:`ClientOptions`;
:func:`verl_vllm_rm.options.build` validates them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from verl_vllm_rm.options import check_ranges
from verl_vllm_rm.protocol.defaults import API_KEY_ENV, DEFAULT_SERVER_URL


@dataclass(frozen=True)
class ClientOptions:
    """How the trainer talks to the reward server(s)."""

    server_url: list[str] = field(default_factory=lambda: [DEFAULT_SERVER_URL])
    api_key: str | None = field(default_factory=lambda: os.environ.get(API_KEY_ENV) or None)
    model: str | None = None
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    request_timeout_s: float = 300.0
    deadline_s: float = 900.0
    max_retries: int = 4
    backoff_base_s: float = 0.25
    backoff_max_s: float = 8.0
    max_concurrent_requests: int = 8
    max_batch_seqs: int = 256
    max_batch_tokens: int = 131072
    endpoint_cooldown_s: float = 5.0
    # a request unanswered after failover_after_s has its server's /health checked (health_timeout_s): a server
    # that does not answer it is treated as hung and the request goes to another server, so a hung server costs a
    # request at most failover_after_s + health_timeout_s; a busy server that answers /health keeps the request
    failover_after_s: float = 10.0
    health_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        check_ranges(self, {"> 0": ("connect_timeout_s", "read_timeout_s", "request_timeout_s", "deadline_s",
                                    "max_concurrent_requests", "max_batch_seqs", "max_batch_tokens",
                                    "failover_after_s", "health_timeout_s"),
                            ">= 0": ("max_retries", "backoff_base_s", "backoff_max_s", "endpoint_cooldown_s")})
        for url in self.server_url:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server_url entry {url!r} must start with http:// or https://")

    def client_options(self) -> "ClientOptions":
        """The client part of a section that extends this one."""
        return ClientOptions(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ClientOptions)})
