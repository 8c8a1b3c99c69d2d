"""The server's LoRA base store, without vLLM: the plan and the later capture, the room and checkpoint checks (the
merge from it: test_lora_merge.py)."""

from __future__ import annotations

import os
import time

import torch
from lora_base_store import SHAPES, attention_checkpoint, captured_store, plan_store

from verl_vllm_rm.server.weights.lora_bases import PendingLoraBases, room_for


def test_the_store_keeps_private_copies_in_the_served_dtype():
    store, checkpoint = captured_store(torch.bfloat16)
    assert store.modules == sorted(n.removesuffix(".weight") for n in SHAPES if n.endswith(".weight"))
    assert store.nbytes == sum(t.numel() * 2 for t in checkpoint.values())
    assert store.report().to_json() == {"state": "held", "where": "host", "bytes": store.nbytes,
                                        "modules": store.modules, "reason": None, "captured": True}
    for name, tensor in checkpoint.items():
        assert store.tensors[name].dtype == torch.bfloat16
        assert store.tensors[name].data_ptr() != tensor.data_ptr()


def test_a_store_over_its_cap_or_turned_off_is_reported_with_the_reason():
    checkpoint = attention_checkpoint()
    specs = [(n, t.shape, torch.float32) for n, t in checkpoint.items()]
    capped = plan_store(specs, max_bytes=1)
    needed = sum(t.numel() * 4 for t in checkpoint.values())
    assert capped.to_json() == {
        "state": "unavailable", "where": "host", "bytes": 0, "modules": [],
        "reason": f"the LoRA bases need {needed} bytes, more than --weight-update-lora-bases-max-bytes 1; raise the "
                  "cap or publish merged weights", "captured": False}
    off = plan_store(specs, place="off")
    assert (off.state, off.reason) == ("off", "--weight-update-lora-bases off")


def test_the_plan_reports_the_bytes_and_modules_to_come_and_copies_nothing_until_captured():
    checkpoint = attention_checkpoint()
    pending = plan_store([(n, t.shape, torch.bfloat16) for n, t in checkpoint.items()])
    needed = sum(t.numel() * 2 for t in checkpoint.values())
    assert pending.report().to_json() == {
        "state": "held", "where": "host", "bytes": needed, "captured": False, "reason": None,
        "modules": sorted(n.removesuffix(".weight") for n in SHAPES if n.endswith(".weight"))}
    store = pending.capture(lambda: checkpoint.items())
    assert (store.nbytes, store.report().captured) == (needed, True)


def _weight_file(tmp_path, name: str = "model.safetensors") -> str:
    (tmp_path / name).write_bytes(b"weights")
    return str(tmp_path)


def test_weight_files_rewritten_after_the_server_loaded_them_hold_no_store(tmp_path):
    model_dir = _weight_file(tmp_path)
    loaded_at = time.time_ns() - 10**9
    os.utime(tmp_path / "model.safetensors", ns=(loaded_at + 1, loaded_at + 1))
    bases = plan_store([("w.weight", (2, 2), torch.float32)], model_dir=model_dir, loaded_at_ns=loaded_at)
    assert bases.state == "unavailable"
    assert bases.reason == (
        f"the weight files ['model.safetensors'] in {model_dir} changed after the server loaded them; the bases "
        "read from them now would not be the weights it serves: restart the server, or publish merged weights")


def test_weight_files_changed_between_the_plan_and_the_capture_hold_no_store(tmp_path):
    model_dir = _weight_file(tmp_path)
    checkpoint = attention_checkpoint()
    pending = plan_store([(n, t.shape, torch.float32) for n, t in checkpoint.items()], model_dir=model_dir)
    assert isinstance(pending, PendingLoraBases)
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    bases = pending.capture(lambda: checkpoint.items())
    assert bases.state == "unavailable"
    assert bases.reason == (
        f"the weight files in {model_dir} changed after the server read its inventory; the bases read from them "
        "now would not be the weights it serves: restart the server, or publish merged weights")


def test_a_read_that_fails_during_the_capture_is_reported_not_raised():
    checkpoint = attention_checkpoint()
    pending = plan_store([(n, t.shape, torch.float32) for n, t in checkpoint.items()])

    def vanished():
        raise FileNotFoundError("model.safetensors")
        yield  # a generator, like the loader's

    bases = pending.capture(vanished)
    assert (bases.state, bases.reason) == (
        "unavailable", "holding the LoRA bases failed: FileNotFoundError: model.safetensors")


def test_the_host_check_names_the_memory_it_lacks():
    reason = room_for(1 << 60, "host", torch.device("cpu"), None)
    assert reason.startswith(f"the LoRA bases need {1 << 60} bytes of host memory, ")
    assert reason.endswith("use --weight-update-lora-bases device, or --weight-update-lora-bases off")
    assert room_for(1 << 10, "device", torch.device("cpu"), None) is None  # a CPU worker's device is the host
