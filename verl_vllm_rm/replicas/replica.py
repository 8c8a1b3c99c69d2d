"""One managed replica: a Ray actor owning one reward-server process.

The server is started with the actor's pid as the parent it watches (the launcher's
``VERL_VLLM_RM_PARENT_PID``): whatever ends the actor (the run's end, ``ray.kill``, the
driver killed and Ray reaping its actors) also ends the server and its engine.
"""

from __future__ import annotations

from pathlib import Path

from verl_vllm_rm.replicas.launcher import RewardServer, start_server
from verl_vllm_rm.replicas.options import ReplicaOptions

SERVER_API_KEY_ENV = "VLLM_API_KEY"  # what the server reads when --api-key is not given


class ServerReplica:
    """Replica ``index`` of a fleet (the class a Ray actor runs; every method blocks)."""

    def __init__(self, options: ReplicaOptions, index: int, host: str | None, log_dir: str,
                 api_key: str | None) -> None:
        self.options = options
        self.index = index
        self.host = host  # None: this node's IP (a fleet over several nodes)
        self.log_dir = Path(log_dir)
        self.api_key = api_key
        self.server: RewardServer | None = None
        self.starts = 0

    def start(self) -> str:
        """Start the server (stopping a previous one) and return its URL once ``/health`` is ok."""
        self.stop()
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {SERVER_API_KEY_ENV: self.api_key} if self.api_key else {}
        if self.host is None:
            import ray

            self.host = ray.util.get_node_ip_address()
        self.server = start_server(self.options.model, self.options.server_args, host=self.host,
                                   python=self.options.python, startup_timeout_s=self.options.startup_timeout_s,
                                   log_path=self.log_dir / f"replica-{self.index}-start-{self.starts}.log", env=env)
        return self.server.url

    def pid(self) -> int | None:
        """The server process's pid (None when not running)."""
        return self.server.process.pid if self.server and self.server.process.poll() is None else None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __repr__(self) -> str:  # Ray names the actor's log lines with it
        return f"ServerReplica({self.index})"
