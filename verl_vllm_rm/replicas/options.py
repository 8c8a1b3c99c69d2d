"""Options of managed reward-server replicas: ``reward.reward_kwargs.replicas`` (or a ``reward_models`` entry's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from verl_vllm_rm.options import check_ranges

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


@dataclass(frozen=True)
class ReplicaOptions:
    """N replicas of ``python -m verl_vllm_rm.server --model <model> <server_args>`` on verl's Ray cluster."""

    model: str
    num_replicas: int = 1
    gpus_per_replica: float = 0.0  # 0: CPU bundles; a replica with tensor parallelism k wants k
    cpus_per_replica: float = 1.0
    server_args: tuple[str, ...] = ()  # the server's and vLLM's flags, passed through (e.g. --max-model-len 4096)
    placement: PlacementStrategy = "SPREAD"  # Ray placement-group strategy over the replicas' bundles
    host: str | None = None  # None: 127.0.0.1 on a one-node cluster, else the node's IP
    python: str | None = None  # the server environment's interpreter; None: $VERL_VLLM_RM_SERVER_PYTHON/.venv-server
    startup_timeout_s: float = 900.0
    health_interval_s: float = 1.0
    restart_backoff_s: float = 1.0  # first wait before restarting a dead replica; doubles per failed restart
    max_restart_backoff_s: float = 60.0

    def __post_init__(self) -> None:
        check_ranges(self, {">= 1": ("num_replicas",), ">= 0": ("gpus_per_replica", "cpus_per_replica"),
                            "> 0": ("startup_timeout_s", "health_interval_s", "restart_backoff_s",
                                    "max_restart_backoff_s")}, prefix="replicas.")
        if self.max_restart_backoff_s < self.restart_backoff_s:
            raise ValueError("replicas.max_restart_backoff_s must be >= replicas.restart_backoff_s")
        reserved = {"--model", "--host", "--port"} & {a.split("=")[0] for a in self.server_args}
        if reserved:
            raise ValueError(f"replicas.server_args sets {sorted(reserved)}, which the fleet chooses per replica: "
                             "give the model as replicas.model and drop the others")
