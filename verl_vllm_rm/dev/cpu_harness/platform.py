"""A ``cpu`` platform for verl 0.9.1, which registers only cuda, npu and rocm.

Without it, platform detection on a machine without an accelerator falls back to
``nvidia`` (``verl/plugin/platform/platform_manager.py``: ``_detect_platform_name``)
and ``trainer.device=cpu`` is overwritten (``verl/utils/device.py``: ``auto_set_device``).

verl's resource manager reserves one accelerator per worker (``ResourcePoolManager``
creates its pools with ``use_gpu=True``), so the platform reports Ray's ``GPU``
resource: the run gives Ray logical GPUs (``+ray_kwargs.ray_init.num_gpus=N``) that
stand for worker slots, and every tensor stays on the CPU.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Optional

import psutil
import torch
from verl.plugin.platform.platform_base import PlatformBase

PLATFORM_NAME = "cpu"


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` functions verl calls through ``get_torch_device()``.

    Memory figures are the host's (there is no device memory); caches and IPC have
    nothing to free on the CPU.
    """
    module = types.ModuleType("verl_vllm_rm_cpu_device")
    for name in ("Event", "Stream", "StreamContext", "current_stream", "device_count", "is_available",
                 "set_device", "stream", "synchronize"):
        setattr(module, name, getattr(torch.cpu, name))
    module.current_device = lambda: "cpu"
    module.get_device_name = lambda device=None: "cpu"
    module.empty_cache = lambda: None
    module.ipc_collect = lambda: None
    module.set_per_process_memory_fraction = lambda fraction, device=None: None
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)

    def mem_get_info(device=None) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return vm.available, vm.total

    def rss(device=None) -> int:
        return psutil.Process().memory_info().rss

    module.mem_get_info = mem_get_info
    module.memory_allocated = module.memory_reserved = rss
    module.max_memory_allocated = module.max_memory_reserved = rss
    return module


class PlatformCPU(PlatformBase):
    """Every tensor on the CPU, gloo for collectives, Ray's GPU resource as the worker slot."""

    _module = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        if PlatformCPU._module is None:
            PlatformCPU._module = _device_module()
        return PlatformCPU._module

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:  # verl moves modules with .to(get_device_id())
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
