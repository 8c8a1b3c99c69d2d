"""The server's LoRA base store, without vLLM: the plan and the later capture, the room and checkpoint checks (the
merge from it: test_lora_merge.py)."""

from __future__ import annotations

import os
import time

import torch

from verl_vllm_rm.server.weights.lora_bases import LoraBaseStore, PendingLoraBases, plan_lora_bases, room_for

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
ATTN = "model.layers.0.self_attn"
SHAPES = {f"{ATTN}.q_proj.weight": (8, 16), f"{ATTN}.q_proj.bias": (8,), f"{ATTN}.k_proj.weight": (4, 16),
          f"{ATTN}.k_proj.bias": (4,), f"{ATTN}.v_proj.weight": (4, 16), f"{ATTN}.v_proj.bias": (4,),
          f"{ATTN}.o_proj.weight": (16, 8)}


def _checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in SHAPES.items()}


def _plan(specs, max_bytes=None, model_dir: str = "not-a-local-dir", place: str = "host",
          loaded_at_ns: int | None = None):
    return plan_lora_bases(place, torch.device("cpu"), FUSED, specs, max_bytes, model_dir,
                           time.time_ns() if loaded_at_ns is None else loaded_at_ns)


def _store(dtype: torch.dtype = torch.float32) -> tuple[LoraBaseStore, dict[str, torch.Tensor]]:
    checkpoint = _checkpoint()
    pending = _plan([(n, t.shape, dtype) for n, t in checkpoint.items()])
    assert isinstance(pending, PendingLoraBases)
    store = pending.capture(lambda: checkpoint.items())
    assert isinstance(store, LoraBaseStore)
    return store, checkpoint


def test_the_store_keeps_private_copies_in_the_served_dtype():
    store, checkpoint = _store(torch.bfloat16)
    assert store.modules == sorted(n.removesuffix(".weight") for n in SHAPES if n.endswith(".weight"))
    assert store.nbytes == sum(t.numel() * 2 for t in checkpoint.values())
    assert store.report().to_json() == {"state": "held", "where": "host", "bytes": store.nbytes,
                                        "modules": store.modules, "reason": None, "captured": True}
    for name, tensor in checkpoint.items():
        assert store.tensors[name].dtype == torch.bfloat16
        assert store.tensors[name].data_ptr() != tensor.data_ptr()


def test_a_store_over_its_cap_or_turned_off_is_reported_with_the_reason():
    checkpoint = _checkpoint()
    specs = [(n, t.shape, torch.float32) for n, t in checkpoint.items()]
    capped = _plan(specs, max_bytes=1)
    needed = sum(t.numel() * 4 for t in checkpoint.values())
    assert capped.to_json() == {
        "state": "unavailable", "where": "host", "bytes": 0, "modules": [],
        "reason": f"the LoRA bases need {needed} bytes, more than --weight-update-lora-bases-max-bytes 1; raise the "
                  "cap or publish merged weights", "captured": False}
    off = _plan(specs, place="off")
    assert (off.state, off.reason) == ("off", "--weight-update-lora-bases off")


def test_the_plan_reports_the_bytes_and_modules_to_come_and_copies_nothing_until_captured():
    checkpoint = _checkpoint()
    pending = _plan([(n, t.shape, torch.bfloat16) for n, t in checkpoint.items()])
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
    bases = _plan([("w.weight", (2, 2), torch.float32)], model_dir=model_dir, loaded_at_ns=loaded_at)
    assert bases.state == "unavailable"
    assert bases.reason == (
        f"the weight files ['model.safetensors'] in {model_dir} changed after the server loaded them; the bases "
        "read from them now would not be the weights it serves: restart the server, or publish merged weights")


def test_weight_files_changed_between_the_plan_and_the_capture_hold_no_store(tmp_path):
    model_dir = _weight_file(tmp_path)
    checkpoint = _checkpoint()
    pending = _plan([(n, t.shape, torch.float32) for n, t in checkpoint.items()], model_dir=model_dir)
    assert isinstance(pending, PendingLoraBases)
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    bases = pending.capture(lambda: checkpoint.items())
    assert bases.state == "unavailable"
    assert bases.reason == (
        f"the weight files in {model_dir} changed after the server read its inventory; the bases read from them "
        "now would not be the weights it serves: restart the server, or publish merged weights")


def test_a_read_that_fails_during_the_capture_is_reported_not_raised():
    checkpoint = _checkpoint()
    pending = _plan([(n, t.shape, torch.float32) for n, t in checkpoint.items()])

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
