"""The tensor plane both sides share (``protocol.wire``): the bucket layout, the transport checks and the process
group's forming and stalls (no server)."""

from __future__ import annotations

import pytest
import torch

from verl_vllm_rm.protocol.inventory import ParamSpec
from verl_vllm_rm.protocol.wire import ALIGN, BufferPool, dtype_name, pack, plan_buckets, slot_view, to_dtype, unpack


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


def test_each_slot_starts_on_the_next_64_byte_boundary_and_a_tensor_too_big_for_a_bucket_travels_alone():
    specs = [ParamSpec("a", "float32", (3,)), ParamSpec("b", "float16", (5,)), ParamSpec("c", "float32", (20,)),
             ParamSpec("big", "uint8", (300,)), ParamSpec("d", "int64", (2,))]
    layout = [[(s.spec.name, s.offset, s.nbytes) for s in b.slots] + [b.nbytes] for b in plan_buckets(specs, 100)]
    assert layout == [
        [("a", 0, 12), ("b", 64, 10), 74],  # c (80 bytes) would end at 208 > 100: a new bucket
        [("c", 0, 80), 80],
        [("big", 0, 300), 300],
        [("d", 0, 16), 16],
    ]
    assert plan_buckets([], 100) == []


@pytest.mark.parametrize("size", [0, -1])
def test_a_bucket_size_that_is_not_positive_is_refused(size):
    with pytest.raises(ValueError, match=rf"^bucket_bytes must be a positive number of bytes, got {size}: give the "
                                         r"publisher a bucket size > 0 \(default 67108864, 64 MiB\)$"):
        plan_buckets([ParamSpec("a", "float32", (1,))], size)


def test_a_slot_is_a_view_of_the_buffer_in_its_own_dtype_and_shape():
    bucket = plan_buckets([ParamSpec("x", "int8", (3,)), ParamSpec("y", "int32", (2, 2))], 1024)[0]
    buffer = torch.zeros(bucket.nbytes, dtype=torch.uint8)
    y = slot_view(buffer, bucket.slots[1])
    assert y.dtype == torch.int32 and y.shape == (2, 2)
    y.fill_(-1)  # no copy: the buffer's bytes from offset 64 change
    assert buffer[:64].tolist() == [0] * 64 and buffer[64:80].tolist() == [255] * 16
    with pytest.raises(ValueError, match=r"zip\(\) argument 2 is shorter than argument 1"):  # one tensor short
        pack(bucket, [torch.ones(3)], buffer)


def test_a_pool_keeps_its_buffers_and_grows_only_the_one_too_small():
    pool = BufferPool(torch.device("cpu"))
    first = pool.get(0, 100)
    assert first.numel() == 100 and first.dtype == torch.uint8 and pool.nbytes == 100
    assert pool.get(0, 40).data_ptr() == first.data_ptr() and pool.get(0, 40).numel() == 40  # reused, cut to size
    assert pool.get(2, 10).numel() == 10 and [b.numel() for b in pool.buffers] == [100, 0, 10]
    assert pool.get(0, 500).numel() == 500 and pool.nbytes == 510


def test_dtype_names_are_torchs_without_its_prefix():
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(torch.float8_e4m3fn) == "float8_e4m3fn"
    assert to_dtype("float16") is torch.float16 and to_dtype(dtype_name(torch.int64)) is torch.int64
