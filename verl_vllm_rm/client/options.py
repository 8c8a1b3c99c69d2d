"""How the trainer side talks to a server: the options every client section shares.

Each reward model's options (``reward_kwargs``, each ``reward_models`` entry) and the ``judge`` section hold one
:class:`ClientOptions`, its keys given at their own level (:func:`verl_vllm_rm.options.inline`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from verl_vllm_rm.options import check_ranges
from verl_vllm_rm.protocol.defaults import API_KEY_ENV, DEFAULT_SERVER_URL


@dataclass(frozen=True)
class ClientOptions:
    """How the trainer talks to the reward server(s)."""

    server_url: list[str] = field(default_factory=lambda: [DEFAULT_SERVER_URL])
    """One URL or a list; with several, requests go to the server with the fewest outstanding requests and a retry
    goes to another server (fail-over from a down, failing or slow one)."""
    api_key: str | None = field(default_factory=lambda: os.environ.get(API_KEY_ENV) or None)
    """Sent as ``Authorization: Bearer``; unset: ``$VERL_VLLM_RM_API_KEY``."""
    model: str | None = None
    """The served model name to check against (the ``/score`` ``model`` field)."""
    connect_timeout_s: float = 10.0
    """TCP connect timeout per attempt, in seconds."""
    read_timeout_s: float = 120.0
    """Socket read timeout per attempt, in seconds."""
    request_timeout_s: float = 300.0
    """Total time per attempt, in seconds."""
    deadline_s: float = 900.0
    """Total time per call, retries included, in seconds."""
    max_retries: int = 4
    """Retries on connection errors, timeouts, 429, 5xx and malformed responses (never on other 4xx)."""
    backoff_base_s: float = 0.25
    """First wait between retries (exponential backoff with jitter), in seconds."""
    backoff_max_s: float = 8.0
    """Longest wait between retries, in seconds."""
    max_concurrent_requests: int = 8
    """In-flight requests per event loop (per reward-loop worker)."""
    max_batch_seqs: int = 256
    """Most sequences per request."""
    max_batch_tokens: int = 131072
    """Most tokens per request."""
    endpoint_cooldown_s: float = 5.0
    """How long a server that refused a connection, or hung, is avoided, in seconds."""
    failover_after_s: float = 10.0
    """A request unanswered this long has its server's ``/health`` checked: a server that does not answer it within
    ``health_timeout_s`` is hung and the request goes to another server (a busy server that answers keeps it)."""
    health_timeout_s: float = 5.0
    """How long that ``/health`` check waits; a hung server costs a request at most ``failover_after_s`` + this."""

    def __post_init__(self) -> None:
        check_ranges(self, {"> 0": ("connect_timeout_s", "read_timeout_s", "request_timeout_s", "deadline_s",
                                    "max_concurrent_requests", "max_batch_seqs", "max_batch_tokens",
                                    "failover_after_s", "health_timeout_s"),
                            ">= 0": ("max_retries", "backoff_base_s", "backoff_max_s", "endpoint_cooldown_s")})
        for url in self.server_url:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"server_url entry {url!r} must start with http:// or https://")
