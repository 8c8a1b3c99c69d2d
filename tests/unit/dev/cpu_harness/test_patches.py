"""The CPU harness's patch list (``dev/cpu_harness/patches.py``), in-process and without activating the harness:
the backend string verl builds on the cpu platform, made a valid one, and the list itself. (That each patch still
applies to the installed verl, in an activated process: tests/integration/dev/test_cpu_harness.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.distributed

from verl_vllm_rm.dev.cpu_harness.patches import PATCHES, _dedupe_backends, _patch_backend_string

#: what verl's initialize_global_process_group_ray builds on the cpu platform: f"cpu:gloo,{device}:{backend}"
VERL_CPU_BACKEND = "cpu:gloo,cpu:gloo"


def test_backend_string_dedupe():
    assert _dedupe_backends("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert _dedupe_backends("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert _dedupe_backends("gloo") == "gloo" and _dedupe_backends(None) is None


def test_a_repeated_entry_is_dropped_keeping_the_first_order_and_spaces_are_trimmed():
    assert _dedupe_backends("cpu:gloo, cuda:nccl,cpu:gloo") == "cpu:gloo,cuda:nccl"


@pytest.fixture()
def unpatched_init(monkeypatch):
    """torch.distributed.init_process_group as torch has it, put back after the test (the patch replaces it)."""
    monkeypatch.setattr(torch.distributed, "init_process_group", torch.distributed.init_process_group)
    return torch.distributed.init_process_group


def one_rank_group(tmp_path, name: str, *args, **kwargs) -> str:
    """A gloo group of one rank made with ``args``/``kwargs``: its backend, after a sum over it."""
    torch.distributed.init_process_group(*args, init_method=f"file://{tmp_path / name}", rank=0, world_size=1,
                                         **kwargs)
    try:
        total = torch.tensor([3.0])
        torch.distributed.all_reduce(total)
        assert total.tolist() == [3.0]
        return torch.distributed.get_backend()
    finally:
        torch.distributed.destroy_process_group()


def test_torch_refuses_the_backend_string_verl_builds_on_the_cpu_platform(tmp_path, unpatched_init):
    """What the gloo-backend-string patch works around (the error its ``why`` quotes)."""
    with pytest.raises(ValueError, match="Duplicate device type cpu"):
        one_rank_group(tmp_path, "store", VERL_CPU_BACKEND)


def test_the_patched_init_makes_the_group_with_the_deduplicated_backend(tmp_path, unpatched_init):
    _patch_backend_string()
    patched = torch.distributed.init_process_group
    assert patched is not unpatched_init and patched._vrm_dedupe
    _patch_backend_string()  # applied once only: a second call keeps the same wrapper
    assert torch.distributed.init_process_group is patched
    assert one_rank_group(tmp_path, "positional", VERL_CPU_BACKEND) == "cpu:gloo"
    assert one_rank_group(tmp_path, "keyword", backend=VERL_CPU_BACKEND) == "cpu:gloo"


def test_every_patch_has_its_own_name_and_says_where_and_why():
    names = [patch.name for patch in PATCHES]
    assert len(names) == len(set(names)), names
    assert {"cpu-platform", "gloo-backend-string", "hf-cpu-rollout", "cpu-gloo-checkpoint-engine"} <= set(names)
    assert all(patch.verl_code and patch.why and callable(patch.needed) and callable(patch.apply)
               for patch in PATCHES)
