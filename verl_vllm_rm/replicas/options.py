"""Options of managed reward-server replicas: ``reward.reward_kwargs.replicas`` (or a ``reward_models`` entry's)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Mapping

from verl_vllm_rm.options import check_ranges
from verl_vllm_rm.protocol.command_line import flag_value

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


@dataclass(frozen=True)
class ReplicaOptions:
    """N replicas of ``python -m verl_vllm_rm.server --model <model> <server_args>`` on verl's Ray cluster."""

    model: str
    """The RM checkpoint each replica serves (``--model``)."""
    num_replicas: int = 1
    """How many servers."""
    gpus_per_replica: float | None = None
    """GPUs of each replica's placement-group bundle; unset: its ``server_args``' tensor x pipeline parallelism where
    Ray has GPUs, else 0 (CPU bundles); a number is taken as given."""
    cpus_per_replica: float = 1.0
    """CPUs of each replica's placement-group bundle."""
    server_args: tuple[str, ...] = ()
    """The server's and vLLM's flags, passed through (e.g. ``[--max-model-len, "4096"]``); ``--model``, ``--host``,
    ``--port`` are the fleet's."""
    placement: PlacementStrategy = "SPREAD"
    """Ray placement-group strategy over the replicas' bundles."""
    host: str | None = None
    """Bind address; unset: ``127.0.0.1`` on a one-node cluster, else each replica's node IP (then give an
    ``api_key``)."""
    python: str | None = None
    """The server environment's interpreter; unset: ``$VERL_VLLM_RM_SERVER_PYTHON``, else ``.venv-server``."""
    startup_timeout_s: float = 900.0
    """Placement and start-up limit, in seconds."""
    health_interval_s: float = 1.0
    """How often each replica's ``/health`` is read, in seconds."""
    health_timeout_s: float = 5.0
    """A ``/health`` unanswered this long (seconds) takes the replica out of routing (hung or down)."""
    hung_restart_s: float = 60.0
    """A replica whose process lives but whose ``/health`` has failed this long (seconds) is restarted."""
    restart_backoff_s: float = 1.0
    """First wait before restarting a replica, in seconds; doubles after each failed start."""
    max_restart_backoff_s: float = 60.0
    """The cap of that doubling wait, in seconds."""
    max_failed_starts: int = 5
    """A replica whose start fails this many times in a row is given up."""
    min_healthy: int | None = None
    """Replicas that must start for the run to begin, and remain (not given up) for it to go on; unset: all."""

    def __post_init__(self) -> None:
        check_ranges(self, {">= 1": ("num_replicas", "max_failed_starts", "min_healthy"),
                            ">= 0": ("gpus_per_replica", "cpus_per_replica"),
                            "> 0": ("startup_timeout_s", "health_interval_s", "health_timeout_s", "hung_restart_s",
                                    "restart_backoff_s", "max_restart_backoff_s")}, prefix="replicas.")
        if self.max_restart_backoff_s < self.restart_backoff_s:
            raise ValueError(f"replicas.max_restart_backoff_s={self.max_restart_backoff_s:g} is less than "
                             f"replicas.restart_backoff_s={self.restart_backoff_s:g}, the first wait it caps: raise "
                             "max_restart_backoff_s or lower restart_backoff_s")
        if self.min_healthy is not None and self.min_healthy > self.num_replicas:
            raise ValueError(f"replicas.min_healthy={self.min_healthy} is more than replicas.num_replicas="
                             f"{self.num_replicas}: lower it, or leave it unset (all replicas)")
        parallel = self.model_parallel_size  # one replica sharing a GPU (a fraction) is fine; a sharded one is not
        if parallel > 1 and self.gpus_per_replica is not None and 0 < self.gpus_per_replica < parallel:
            raise ValueError(f"replicas.gpus_per_replica={self.gpus_per_replica:g} is less than the "
                             f"{parallel} GPUs its server_args' tensor/pipeline parallelism use: set it to {parallel}, or "
                             "leave it unset")
        reserved = {"--model", "--host", "--port"} & {a.split("=")[0] for a in self.server_args}
        if reserved:
            raise ValueError(f"replicas.server_args sets {sorted(reserved)}, which the fleet chooses per replica: "
                             "give the model as replicas.model and drop the others")

    @property
    def required(self) -> int:
        """Replicas that must be up for the run to go on (``min_healthy``, else all)."""
        return self.num_replicas if self.min_healthy is None else self.min_healthy

    @property
    def model_parallel_size(self) -> int:
        """GPUs one replica's server uses: its ``--tensor-parallel-size`` x ``--pipeline-parallel-size``."""
        size = 1
        for flags in (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp")):
            size *= int(flag_value(self.server_args, flags) or 1)
        return size

    def gpus_on(self, cluster_gpus: float) -> float:
        """GPUs a replica's bundle asks for on a cluster with ``cluster_gpus`` GPUs in all."""
        if self.gpus_per_replica is not None:
            return self.gpus_per_replica
        return float(self.model_parallel_size) if cluster_gpus > 0 else 0.0


def replica_gpus_available(resources: Mapping[str, float], environ: Mapping[str, str] = os.environ) -> float:
    """The GPUs replicas may ask Ray for: the cluster's, or none when verl runs on its CPU platform
    (``VERL_PLATFORM=cpu``, as the CPU harness runs it), whose Ray GPU is a stand-in that verl's own pools hold."""
    if environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        return 0.0
    return float(resources.get("GPU", 0.0))

