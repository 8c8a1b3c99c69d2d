"""What both sides of a weight update agree on: parameter names, the inventory's checks, the bucket layout (no server)."""

from __future__ import annotations

import pytest
import torch
from sync_helpers import load_rm

from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.names import normalize_name, resolve_name
from verl_vllm_rm.protocol.wire import ALIGN, BufferPool, pack, plan_buckets, unpack

QWEN2_FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
         "model.layers.0.self_attn.q_proj.weight"),
        ("base_model.model.score.modules_to_save.default.weight", "score.weight"),
        ("base_model.model.score.original_module.weight", None),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
        ("base_model.model.model.embed_tokens.lora_embedding_B.default", None),
        ("module._fsdp_wrapped_module.model.layers.1._checkpoint_wrapped_module.mlp.up_proj.weight",
         "model.layers.1.mlp.up_proj.weight"),
        ("_orig_mod.model.norm.weight", "model.norm.weight"),
        ("score.weight", "score.weight"),
    ],
)
def test_normalize_name(raw, expected):
    assert normalize_name(raw) == expected


def test_resolve_name_fixes_the_model_prefix():
    known = {"model.norm.weight", "score.weight"}
    assert resolve_name("model.model.norm.weight", known) == "model.norm.weight"
    assert resolve_name("model.model.model.norm.weight", known) == "model.norm.weight"
    assert resolve_name("norm.weight", known) == "model.norm.weight"
    assert resolve_name("score.weight", known) == "score.weight"
    assert resolve_name("model.nope.weight", known) == "model.nope.weight"


@pytest.fixture(scope="module")
def inventory(tiny_rm) -> Inventory:
    """What the server reports for the tiny RM: its checkpoint tensors and Qwen2's fused modules."""
    specs = [ParamSpec(n, "float32", tuple(t.shape)) for n, t in load_rm(tiny_rm).state_dict().items()]
    return Inventory(specs, QWEN2_FUSED)


def test_inventory_groups_fused_modules_with_their_biases(inventory):
    assert inventory.group_of("model.layers.0.self_attn.k_proj.bias") == [
        f"model.layers.0.self_attn.{p}_proj.{k}" for p in "kqv" for k in ("bias", "weight")
    ]
    assert inventory.group_of("model.layers.0.mlp.up_proj.weight") == [
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"
    ]
    assert inventory.group_of("score.weight") == ["score.weight"]
    assert inventory.complete_groups(["model.layers.1.mlp.gate_proj.weight"]) == [
        "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"
    ]


def test_check_update_lists_every_problem(inventory):
    specs = [
        ParamSpec("model.layers.0.self_attn.q_proj.weight", "float32", (128, 128)),
        ParamSpec("score.weight", "float16", (1, 128)),
        ParamSpec("model.norm.weight", "float32", (64,)),
    ]
    with pytest.raises(WeightUpdateRefused) as err:
        inventory.check_update(specs, "head_only")
    message = str(err.value)
    for fragment in ("partial module 'model.layers.0.self_attn.qkv_proj'", "is float16", "has shape [64]",
                     "backbone tensor but training_mode is head_only"):
        assert fragment in message
    inventory.check_update([ParamSpec(n, p.dtype, p.shape) for n, p in inventory.params.items()], "full")


def test_total_size_cap(inventory):
    head = [ParamSpec("score.weight", "float32", (1, 128))]
    inventory.check_update(head, "head_only", max_bytes=512)
    with pytest.raises(WeightUpdateRefused, match="carries 512 bytes, more than this server's cap of 511"):
        inventory.check_update(head, "head_only", max_bytes=511)


def test_buckets_are_bounded_aligned_and_round_trip():
    tensors = {f"t{i}": torch.randn(i + 3, 5) for i in range(10)} | {"big": torch.randn(100, 100)}
    specs = [ParamSpec(n, "bfloat16", tuple(t.shape)) for n, t in tensors.items()]
    buckets = plan_buckets(specs, bucket_bytes=256)
    assert plan_buckets(specs, bucket_bytes=256) == buckets
    assert [s.spec.name for b in buckets for s in b.slots] == list(tensors)
    for b in buckets:
        assert b.nbytes <= 256 or len(b.slots) == 1
        assert all(s.offset % ALIGN == 0 for s in b.slots)
    received, pool = {}, BufferPool(torch.device("cpu"))
    for b in buckets:
        buffer = pack(b, [tensors[s.spec.name] for s in b.slots], pool.get(0, b.nbytes))
        received.update((n, t.clone()) for n, t in unpack(b, buffer))
    for name, t in tensors.items():
        assert received[name].dtype == torch.bfloat16
        assert torch.equal(received[name], t.to(torch.bfloat16))


def test_a_trainer_whose_nccl_differs_from_the_servers_is_refused_naming_both_and_the_fix():
    from verl_vllm_rm.protocol.wire import nccl_version, transport_mismatch

    assert transport_mismatch("gloo", None, None) is None and transport_mismatch("nccl", "2.29.7", "2.29.7") is None
    assert transport_mismatch("nccl", "2.29.7", "2.28.9") == (
        "the server's NCCL is 2.29.7 and this trainer's is 2.28.9; NCCL refuses peers of another version: install "
        "one NCCL in both environments (e.g. pip install --no-deps nvidia-nccl-cu13==2.29.7 in the trainer's, as "
        "`make setup DEVICE=gpu` does from requirements/nccl-gpu.txt)")
    assert "this trainer has no CUDA: publish from a trainer on a GPU, or start the server with " \
           "--weight-update-backend gloo" in transport_mismatch("nccl", "2.29.7", None)
    assert nccl_version() is None  # this CPU machine: no CUDA, no NCCL to report


@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_the_nccl_transport_takes_the_ranks_own_device_never_the_threads(device):
    """A join or receive thread's current CUDA device is 0 whatever its process uses: open_group refuses to
    guess, before any store or group exists (the device a worker passes is its own, vLLM's ``self.device``)."""
    import torch

    from verl_vllm_rm.protocol.wire import open_group

    with pytest.raises(ValueError, match=r"the nccl transport needs this rank's own CUDA device \(cuda:N\), got "):
        open_group("nccl", "127.0.0.1", 1, 0, 2, 1.0, "s", device=None if device is None else torch.device(device))


def test_an_nccl_group_is_built_to_raise_on_a_failed_collective_not_to_kill(monkeypatch):
    """torch reads TORCH_NCCL_BLOCKING_WAIT when a ProcessGroupNCCL is constructed: set, a timed-out or failed
    collective is aborted and raises from ``wait()`` and no watchdog tears the process down. This CPU build of
    torch has no ProcessGroupNCCL (it needs CUDA), so a recorder stands in for the class to see the environment
    it is constructed in, and for the warm-up broadcast that forms the group (a CUDA tensor); the real store is
    made. The process's own setting is back afterwards."""
    import os

    import torch.distributed as dist

    from verl_vllm_rm.client.http import free_port
    from verl_vllm_rm.protocol.wire import TransferGroup, open_group

    seen = {}

    class RecordingProcessGroupNCCL:
        class Options:
            pass

        def __init__(self, store, rank, world_size, options):
            seen.update(blocking_wait=os.environ.get("TORCH_NCCL_BLOCKING_WAIT"), timeout=options._timeout)

    monkeypatch.setattr(dist, "ProcessGroupNCCL", RecordingProcessGroupNCCL, raising=False)
    monkeypatch.setattr(TransferGroup, "form", lambda group, timeout_s: seen.update(formed_within=timeout_s))
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "0")
    group = open_group("nccl", "127.0.0.1", free_port("127.0.0.1"), 0, 1, 7.0, "s", join_timeout_s=3.0,
                       device=torch.device("cuda", 1))
    assert seen["blocking_wait"] == "1" and seen["timeout"].total_seconds() == 7.0
    assert seen["formed_within"] == 3.0  # formed eagerly, within the join's bound
    assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "0"  # the process's own setting, for its own groups
    assert group.device == torch.device("cuda", 1)


def test_a_group_is_formed_when_opened_and_a_wait_with_no_progress_is_a_named_stall():
    """Two ranks over gloo in this process: ``open_group`` returns only once the warm-up broadcast reached both
    (the group is formed, not lazily connected at the first bucket); then a rank that never receives again makes
    the sender's wait end after the group's timeout with :class:`TransferStalled` naming what it waited for."""
    import threading

    import torch

    from verl_vllm_rm.client.http import free_port
    from verl_vllm_rm.protocol.wire import TransferStalled, open_group

    port = free_port("127.0.0.1")
    formed, silent = threading.Event(), threading.Event()

    def receiver() -> None:
        group = open_group("gloo", "127.0.0.1", port, 1, 2, 1.0, "stall")
        formed.set()
        silent.wait(30)  # joined and formed, then never receives (the group kept: its sockets stay open)
        del group

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    sender = open_group("gloo", "127.0.0.1", port, 0, 2, 1.0, "stall", join_timeout_s=30.0)
    assert formed.wait(30)  # the receiver's open_group returned too: the warm-up reached it
    try:
        with pytest.raises(TransferStalled, match=r"^sending bucket 1 of 1: no progress for 1 s \((?i:.*timed out)"):
            sender.wait(sender.broadcast(torch.ones(1 << 20, dtype=torch.uint8)), "sending bucket 1 of 1")
    finally:
        silent.set()
        thread.join(30)
