"""The CPU harness, activated in a fresh process (one for every check of it: each imports verl, ~10 s): every
patch still applies to the installed verl, worker groups get their port window; and in another, the plugin's
normal path never loads it. (The harness's in-process tests: tests/unit/dev/cpu_harness/.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server  # imports verl in subprocesses


def _python(code: str, **env: str) -> str:
    import os

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}, **env})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1]

#: one fresh process with the harness activated answers every harness test (each such process imports verl,
#: ~10 s): the patches and whether each still applies, what the harness registered, then (it replaces
#: WorkerGroup.__init__, so last) the port windows two worker groups got
ACTIVATED_PROBE = """
import json, torch.distributed as d, verl_vllm_rm.dev.cpu_harness.activate
from verl_vllm_rm.dev.cpu_harness.patches import PATCHES
from verl.utils.device import get_device_name, get_nccl_backend
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.base import get_rollout_class
answer = {"patches": [[p.name, p.verl_code, p.needed()] for p in PATCHES],
          "registered": [get_device_name(), get_nccl_backend(), RolloutReplicaRegistry.get('hf_cpu').__name__,
                         get_rollout_class('hf_cpu', 'async').__name__, d.init_process_group._vrm_dedupe]}
from verl.single_controller.base.worker_group import WorkerGroup
from verl.single_controller.ray.base import RayWorkerGroup
def base_init(self, resource_pool=None, **kw):
    self._is_init_with_detached_workers = False
WorkerGroup.__init__ = base_init
seen = []
class Probe(RayWorkerGroup):
    def _init_with_resource_pool(self, **kw):
        seen.append(self._ray_master_port_range)
from types import SimpleNamespace as Pool
Probe(resource_pool=Pool(use_gpu=False))
Probe(resource_pool=Pool(use_gpu=False), master_port_range=[40000, 40010])
answer["port_windows"] = seen
print(json.dumps(answer))
"""


@pytest.fixture(scope="module")
def activated() -> dict:
    return json.loads(_python(ACTIVATED_PROBE))


def test_every_patch_still_applies_to_the_installed_verl(activated):
    """A verl upgrade that fixes (or moves) what a patch works around fails here, naming the patch."""
    patches = activated["patches"]
    assert len(patches) >= 5
    stale = [f"{name} ({code})" for name, code, needed in patches if not needed]
    assert not stale, f"these harness patches no longer apply to the installed verl: {stale}"


def test_the_harness_registers_cpu_and_the_rollout_backend(activated):
    assert activated["registered"] == ["cpu", "gloo", "CPURolloutReplica", "CPUServerAdapter", True]


def test_plugin_and_verl_never_load_the_harness():
    """The plugin's normal path (entry point, manager) leaves verl's platforms and torch untouched."""
    out = _python("import sys, json, verl, verl_vllm_rm.plugin.register, verl_vllm_rm.scoring.manager; "
                  "from verl.plugin.platform.platform_manager import PlatformRegistry; "
                  "print(json.dumps(['verl_vllm_rm.dev.cpu_harness.activate' in sys.modules, "
                  "PlatformRegistry.get('cpu')]))")
    assert json.loads(out) == [False, None]


def test_every_worker_group_gets_a_port_window_below_the_ephemeral_range(activated):
    """The harness gives a RayWorkerGroup made without a master_port_range (verl's trainer never passes one) a
    random window below the kernel's ephemeral ports; one given a range keeps it. (The group's workers are not
    started: the probe records the range where verl's __init__ would place them.)"""
    window, given = activated["port_windows"]
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert 10000 <= window[0] and window[1] == window[0] + 1000 <= low, window
    assert given == [40000, 40010]
