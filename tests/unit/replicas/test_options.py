"""Managed replicas' options: how many GPUs a replica asks Ray for (by default what its server's parallelism uses,
where there are GPUs), the settings a fleet refuses, and the replicas option block as the manager's options read it
(one per RM entry)."""

from __future__ import annotations

import re

import pytest

from verl_vllm_rm.replicas.options import ReplicaOptions, replica_gpus_available
from verl_vllm_rm.scoring.options import parse_options


@pytest.mark.parametrize(("server_args", "gpus"), [
    ((), 1.0),
    (("--tensor-parallel-size", "2"), 2.0),
    (("-tp=2", "--pipeline-parallel-size", "2"), 4.0),
    (("--max-model-len", "4096"), 1.0),
])
def test_unset_gpus_follow_the_servers_parallelism_on_a_gpu_cluster_and_are_zero_on_cpu(server_args, gpus):
    options = ReplicaOptions(model="/rm", server_args=server_args)
    assert options.gpus_on(cluster_gpus=8) == gpus
    assert options.gpus_on(cluster_gpus=0) == 0.0


def test_a_number_is_taken_as_given_and_too_few_for_the_parallelism_is_refused():
    assert ReplicaOptions(model="/rm", gpus_per_replica=0).gpus_on(cluster_gpus=8) == 0.0  # CPU bundles by choice
    assert ReplicaOptions(model="/rm", gpus_per_replica=0.5).gpus_on(cluster_gpus=8) == 0.5
    with pytest.raises(ValueError, match=r"replicas.gpus_per_replica=1 is less than the 2 GPUs its server_args' "
                                         r"tensor/pipeline parallelism use: set it to 2, or leave it unset"):
        ReplicaOptions(model="/rm", gpus_per_replica=1, server_args=("--tensor-parallel-size", "2"))


def test_verls_cpu_platform_has_no_gpus_for_replicas():
    """The CPU harness gives Ray one stand-in GPU for verl's own pools (VERL_PLATFORM=cpu): replicas asking for it
    would wait for a GPU verl's actor holds, so on verl's CPU platform they get CPU bundles."""
    assert replica_gpus_available({"GPU": 8.0, "CPU": 64.0}, environ={}) == 8.0
    assert replica_gpus_available({"CPU": 2.0}, environ={}) == 0.0
    assert replica_gpus_available({"GPU": 1.0, "CPU": 2.0}, environ={"VERL_PLATFORM": "cpu"}) == 0.0
    assert replica_gpus_available({"GPU": 8.0}, environ={"VERL_PLATFORM": "cuda"}) == 8.0


def test_a_backoff_cap_below_the_first_backoff_is_refused():
    with pytest.raises(ValueError, match=r"replicas.max_restart_backoff_s=2 is less than replicas.restart_backoff_s=5, "
                                         r"the first wait it caps: raise max_restart_backoff_s or lower "
                                         r"restart_backoff_s"):
        ReplicaOptions(model="/rm", restart_backoff_s=5, max_restart_backoff_s=2)


@pytest.mark.parametrize("server_args, reserved", [
    (("--port", "9000"), "['--port']"),
    (("--model=/other", "--host", "0.0.0.0", "--max-model-len", "4096"), "['--host', '--model']"),
])
def test_server_args_may_not_set_what_the_fleet_chooses_per_replica(server_args, reserved):
    with pytest.raises(ValueError, match=rf"replicas.server_args sets {re.escape(reserved)}, which the fleet chooses "
                                         r"per replica: give the model as replicas.model and drop the others"):
        ReplicaOptions(model="/rm", server_args=server_args)


@pytest.mark.parametrize("kwargs, message", [
    ({"server_url": "http://a:1", "replicas": {"model": "/rm"}}, r"both server_url \['http://a:1'\] and replicas"),
    ({"replicas": {"model": "/rm", "num_replicas": 0}}, r"num_replicas must be >= 1"),
    ({"replicas": {"model": "/rm", "server_args": ["--port=9"]}}, r"server_args sets \['--port'\]"),
    ({"replicas": {"model": "/rm", "restart_backoff_s": 9, "max_restart_backoff_s": 2}}, r"max_restart_backoff_s"),
    ({"replicas": {"model": "/rm", "placement": "ANY"}}, r"placement='ANY' is not one of"),
    ({"replicas": {"num_replicas": 2}}, r"model"),
    ({"replicas": {"model": "/rm", "num_replicas": 2, "min_healthy": 3}},
     r"min_healthy=3 is more than replicas.num_replicas=2: lower it, or leave it unset"),
    ({"replicas": {"model": "/rm", "min_healthy": 0}}, r"min_healthy must be >= 1, got 0"),
    ({"replicas": {"model": "/rm", "max_failed_starts": 0}}, r"max_failed_starts must be >= 1, got 0"),
    ({"replicas": {"model": "/rm", "hung_restart_s": 0}}, r"hung_restart_s must be > 0, got 0"),
    ({"replicas": {"model": "/rm", "health_timeout_s": -1}}, r"health_timeout_s must be > 0, got -1"),
])
def test_replicas_options_refusals_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        parse_options(kwargs)


def test_each_rm_entry_has_its_own_servers_or_replicas():
    opts = parse_options({"server_url": "http://a:1", "reward_models": [
        {"name": "helpful"}, {"name": "safety", "replicas": {"model": "/rm", "num_replicas": 2}}]})
    helpful, safety = opts.rm_options
    assert helpful.client.server_url == ["http://a:1"] and helpful.replicas is None
    assert safety.replicas.num_replicas == 2  # the top level's server_url belongs to the other RM
    top = parse_options({"replicas": {"model": "/rm"}, "reward_models": [
        {"name": "a"}, {"name": "b", "server_url": "http://b:1"}]})
    a, b = top.rm_options
    assert a.replicas.model == "/rm" and b.replicas is None and b.client.server_url == ["http://b:1"]
