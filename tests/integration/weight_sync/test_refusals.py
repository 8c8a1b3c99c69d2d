"""Refused updates: a clear error before any tensor moves, and the old weights keep serving."""

from __future__ import annotations

import re

import pytest
import requests
import torch
from fault_proxy import FaultProxy, Faults
from sync_helpers import assert_parity, load_rm, reset_server, runtime_version, update_record

from verl_vllm_rm.weight_sync import RewardModelPublisher, WeightUpdateRefused
from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES


Q = "model.layers.0.self_attn.q_proj"


@pytest.fixture()
def served(ws_server, tiny_rm, probe_ids):
    """The on-disk model, serving; yields (publisher, model, proxy): the publisher talks to the server through
    a recording proxy, and afterwards the version and the scores are unchanged."""
    reset_server(ws_server.url, tiny_rm)
    model = load_rm(tiny_rm)
    version = runtime_version(ws_server.url)
    with FaultProxy(ws_server.url) as proxy:
        with RewardModelPublisher(proxy.url, timeout_s=60) as pub:
            yield pub, model, proxy
    assert runtime_version(ws_server.url) == version
    assert_parity(ws_server.url, model, probe_ids)


def assert_nothing_sent(url: str, before: dict, proxy=None) -> None:
    """No update started: /health's update record is as before (an accepted update, even one that broke
    mid-transfer, leaves ``last_update``/``last_failed_update`` behind) and, when the publisher went through
    ``proxy``, it never sent ``/update_param_batch``."""
    assert update_record(url) == before
    assert before["pending_update"] is None
    if proxy is not None:
        assert [r["path"] for r in proxy.requests if r["path"] == "/update_param_batch"] == []


def _changed(model, *names: str) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    return {n: sd[n] + 1.0 for n in names}


@pytest.mark.parametrize(
    "state_dict_of, training_mode, expected",
    [
        (lambda m: {"model.layers.0.mlp.gate_projection.weight": torch.zeros(256, 128)}, "full", "unknown parameter"),
        (lambda m: {"score.weight": torch.zeros(1, 64)}, "head_only", "has shape [1, 64]"),
        (lambda m: _changed(m, f"{Q}.weight", f"{Q}.bias"), "full",
         "partial module 'model.layers.0.self_attn.qkv_proj'"),
        (lambda m: _changed(m, "model.layers.0.mlp.up_proj.weight"), "full", "without ['model.layers.0.mlp.gate_proj"),
        (lambda m: {"classifier.weight": torch.zeros(1, 128)}, "head_only", "did you mean 'score.weight'"),
        (lambda m: {"model.norm.weight": torch.ones(128)}, "head_only", "update is empty"),
        (lambda m: m.state_dict(), "adapter_only", "unknown training_mode"),
        (lambda m: {"score.weight": torch.empty(1, 128, device="meta")}, "head_only",
         "['score.weight'] are on torch's meta device"),
    ],
    ids=["unknown-name", "wrong-shape", "q-without-kv", "up-without-gate", "wrong-head-name", "no-head", "bad-mode",
         "meta-tensor"],
)
def test_publisher_refuses_before_sending(served, ws_server, state_dict_of, training_mode, expected):
    """The publisher's own checks refuse: no metadata reaches the server, no update starts."""
    pub, model, proxy = served
    before = update_record(ws_server.url)
    with pytest.raises((WeightUpdateRefused, ValueError), match=expected.replace("[", r"\[").replace("(", r"\(")):
        pub.publish(state_dict_of(model), pub.version + 1, training_mode)
    assert_nothing_sent(ws_server.url, before, proxy)


def test_publisher_refuses_an_old_version(served, ws_server):
    pub, model, proxy = served
    before = update_record(ws_server.url)
    with pytest.raises(WeightUpdateRefused, match="not newer than the serving version"):
        pub.publish(model, pub.version, "full")
    assert_nothing_sent(ws_server.url, before, proxy)


def _post_update(url: str, metadata: list[dict] | dict, mode: str, version: int, **fields) -> requests.Response:
    body = {"metadata": metadata, "training_mode": mode, "version": version, "bucket_bytes": DEFAULT_BUCKET_BYTES,
            **fields}
    return requests.post(f"{url}/update_param_batch", json=body, timeout=30)


SHAPE_RULE = "'shape' must be a list of at most 8 non-negative integers"


def _meta(name: str, shape: list[int], dtype: str = "float32") -> dict:
    return {"name": name, "dtype": dtype, "shape": shape}


@pytest.mark.parametrize(
    "metadata, mode, expected",
    [
        ([_meta("model.layers.0.mlp.down_proj.weight", [128, 256]), _meta("score.weight", [1, 128])],
         "head_only", "is a backbone tensor but training_mode is head_only"),
        ([_meta("model.layers.9.mlp.down_proj.weight", [128, 256])], "full",
         "weight update refused: unknown parameter 'model.layers.9.mlp.down_proj.weight'"),
        ([_meta("score.weight", [2, 128])], "full", "has shape [2, 128]"),
        ([_meta(f"{Q}.weight", [128, 128]), _meta(f"{Q}.bias", [128])], "full", "partial module"),
        ([_meta("score.weight", [1, 128], "bfloat16")], "head_only", "is bfloat16 but the server's is float32"),
        ([_meta("score.weight", [1, 128])], "everything", "unknown training_mode"),
        ([_meta("score.weight", [1, 128], "complex64")], "head_only", "dtype 'complex64' is not one of"),
        ([_meta("score.weight", [1, 128], "Tensor")], "head_only", "dtype 'Tensor' is not one of"),
        ([_meta("score.weight", [1.0, 128])], "head_only",
         f"bad metadata entry for 'score.weight': {SHAPE_RULE}, got [1.0, 128]"),
        ([_meta("score.weight", ["1", 128])], "head_only", f"{SHAPE_RULE}, got ['1', 128]"),
        ([_meta("score.weight", [True, 128])], "head_only", f"{SHAPE_RULE}, got [True, 128]"),
        ([_meta("score.weight", 128)], "head_only", f"{SHAPE_RULE}, got 128"),
        ([_meta("score.weight", [1] * 9)], "head_only", f"{SHAPE_RULE}, got {[1] * 9}"),
        ([{**_meta("score.weight", [1, 128]), "pickle": "gASV"}], "head_only", "exactly {name, dtype, shape}"),
        (["score.weight"], "head_only", "exactly {name, dtype, shape}"),
        (_meta("score.weight", [1, 128]), "head_only", "'metadata' must be a list of {name, dtype, shape}"),
    ],
    ids=["backbone-in-head-only", "unknown-name", "wrong-shape", "q-without-kv", "wrong-dtype", "bad-mode",
         "dtype-not-allowed", "dtype-not-a-dtype", "float-dim", "string-dim", "bool-dim", "shape-not-a-list",
         "nine-dims", "extra-key", "entry-not-an-object", "metadata-not-a-list"],
)
def test_server_refuses_bad_metadata(served, ws_server, metadata, mode, expected):
    """The server checks again (a client other than our publisher may call it): a 400 before the update
    starts (no tensor is awaited, /health records no update)."""
    pub, _, _ = served
    pub.connect()  # a live communicator: the refusal must come from the checks, not from its absence
    before = update_record(ws_server.url)
    resp = _post_update(ws_server.url, metadata, mode, pub.version + 1)
    assert resp.status_code == 400, resp.text
    assert expected in resp.json()["error"]["message"]
    assert_nothing_sent(ws_server.url, before)


@pytest.mark.parametrize("fields, expected", [
    ({"checksum": "abc"}, "unknown field(s) ['checksum']; send metadata, training_mode, version, bucket_bytes and "
                          "optionally commit and lora"),
    ({"bucket_bytes": 0}, "'bucket_bytes' must be a positive integer, got 0"),
    ({"bucket_bytes": "64MiB"}, "'bucket_bytes' must be a positive integer, got '64MiB'"),
], ids=["unknown-field", "zero-bucket", "bucket-as-text"])
def test_server_refuses_an_update_body_with_an_unknown_field_or_a_bad_bucket_size(served, ws_server, fields, expected):
    """A body from a client other than our publisher: a 400 naming the field, before the update starts."""
    pub, _, _ = served
    pub.connect()
    before = update_record(ws_server.url)
    resp = _post_update(ws_server.url, [_meta("score.weight", [1, 128])], "head_only", pub.version + 1, **fields)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"] == expected
    assert_nothing_sent(ws_server.url, before)


def test_server_refuses_a_stale_version_and_a_missing_communicator(served, ws_server):
    pub, _, _ = served
    pub.close()
    before = update_record(ws_server.url)
    resp = _post_update(ws_server.url, [_meta("score.weight", [1, 128])], "head_only", pub.version + 1)
    assert resp.status_code == 409, resp.text
    assert resp.json()["error"]["message"] == "no communicator: call /init_communicator before /update_param_batch"
    pub.connect()
    resp = _post_update(ws_server.url, [_meta("score.weight", [1, 128])], "head_only", pub.version)
    assert resp.status_code == 409 and "greater than the serving version" in resp.json()["error"]["message"]
    assert_nothing_sent(ws_server.url, before)


def test_a_bucket_size_of_zero_is_refused_before_anything_moves(ws_server, tiny_rm):
    """``bucket_bytes=0`` (a publisher built by hand; verl's online_rm section checks it) is refused at the first
    publish, before any communicator or metadata: the server only ever saw the inventory request."""
    before, version = update_record(ws_server.url), runtime_version(ws_server.url)
    with FaultProxy(ws_server.url) as proxy:
        with RewardModelPublisher(proxy.url, bucket_bytes=0) as pub:
            with pytest.raises(ValueError, match=r"^bucket_bytes must be a positive number of bytes, got 0: give the "
                                                 r"publisher a bucket size > 0 \(default 67108864, 64 MiB\)$"):
                pub.publish(load_rm(tiny_rm), version + 1, "head_only")
    assert [r["path"] for r in proxy.requests] == ["/weight_inventory"]
    assert update_record(ws_server.url) == before and runtime_version(ws_server.url) == version


def test_a_trainer_without_cuda_is_refused_by_an_nccl_server(ws_server):
    """A server receiving over NCCL and a trainer with no CUDA: refused when the publisher is built, naming both
    ways out, before any communicator forms (only the inventory was asked for)."""
    # this CPU machine runs no NCCL server (it needs CUDA): the inventory's transport is the one fault injected
    nccl = {"/weight_inventory": lambda inventory: {**inventory, "transport": "nccl", "nccl_version": "2.29.7"}}
    before = update_record(ws_server.url)
    with FaultProxy(ws_server.url, Faults(rewrite=nccl)) as proxy:
        with pytest.raises(WeightUpdateRefused, match=rf"^cannot publish to {re.escape(proxy.url)}: the server "
                                                      r"receives weights over nccl \(GPU\) and this trainer has no "
                                                      r"CUDA: publish from a trainer on a GPU, or start the server "
                                                      r"with --weight-update-backend gloo$"):
            RewardModelPublisher(proxy.url)
    assert [r["path"] for r in proxy.requests] == ["/weight_inventory"]
    assert update_record(ws_server.url) == before


def test_init_communicator_rejects_bad_fields(ws_server):
    resp = requests.post(f"{ws_server.url}/init_communicator", json={"master_address": "127.0.0.1"}, timeout=10)
    assert resp.status_code == 400 and "master_port" in resp.json()["error"]["message"]
