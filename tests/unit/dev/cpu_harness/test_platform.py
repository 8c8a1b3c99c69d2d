"""The harness's ``cpu`` platform for verl (``dev/cpu_harness/platform.py``), made here without registering it:
every tensor on the CPU, gloo for collectives, Ray's GPU resource as a worker slot, and a device module whose
``torch.cuda``-style calls answer for the host."""

from __future__ import annotations

import psutil
import torch

from verl_vllm_rm.dev.cpu_harness.platform import PLATFORM_NAME, PlatformCPU


def test_the_platform_places_on_the_cpu_and_collects_over_gloo():
    platform = PlatformCPU()  # every abstract method of verl's PlatformBase is implemented
    assert PLATFORM_NAME == "cpu"
    assert (platform.device_name, platform.vendor_name, platform.current_device()) == ("cpu", "cpu", "cpu")
    assert (platform.is_available(), platform.device_count()) == (True, 1)
    assert platform.communication_backend_name() == "gloo"
    assert (platform.ray_resource_name(), platform.visible_devices_envvar()) == ("GPU", "CUDA_VISIBLE_DEVICES")
    assert platform.ray_noset_envvars() == ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]
    assert platform.get_device_capability() == (None, None) and not platform.is_ipc_supported()
    with platform.nvtx_range("a step"):
        pass


def test_seeding_through_the_platform_seeds_torch():
    platform = PlatformCPU()
    platform.manual_seed(3)
    first = torch.randn(4)
    platform.manual_seed_all(3)
    assert torch.equal(torch.randn(4), first)


def test_the_device_module_answers_cuda_calls_for_the_host():
    module = PlatformCPU().device_module
    assert PlatformCPU().device_module is module  # made once
    assert (module.current_device(), module.get_device_name()) == ("cpu", "cpu")
    assert module.device_count() == torch.cpu.device_count() and module.is_available()
    available, total = module.mem_get_info()
    assert 0 < available <= total == psutil.virtual_memory().total
    assert module.memory_allocated() > 0 and module.max_memory_reserved() > 0  # the process's resident memory
    assert module.empty_cache() is None and module.ipc_collect() is None
    module.set_per_process_memory_fraction(0.5)  # no device memory to limit: accepted, nothing changes


def test_the_device_modules_rng_state_round_trips():
    module = PlatformCPU().device_module
    module.manual_seed(7)
    state = module.get_rng_state()
    first = torch.rand(3)
    module.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    module.manual_seed_all(7)
    assert torch.equal(torch.rand(3), first)
