"""Activating the CPU harness (``dev/cpu_harness/activate.py``): only importing ``activate`` patches verl, and it
refuses to load where a GPU is visible. (That every patch applies to the installed verl once activated:
tests/integration/dev/test_cpu_harness.py.)"""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_harness_modules_changes_nothing():
    """Only ``activate`` patches: this test imports the rollout and the patch list, and an activated harness in a
    test process would hand VERL_PLATFORM=cpu to every later Ray worker of the suite."""
    import os

    import verl_vllm_rm.dev.cpu_harness.patches  # noqa: F401
    import verl_vllm_rm.dev.cpu_harness.rollout  # noqa: F401

    assert "verl_vllm_rm.dev.cpu_harness.activate" not in sys.modules
    assert "VERL_PLATFORM" not in os.environ and "VERL_ENGINE_DEVICE" not in os.environ


def test_the_harness_refuses_to_load_where_a_gpu_is_visible():
    """activate.py asks ``torch.cuda.is_available()``; no environment variable makes that True on a machine without
    a GPU, so the subprocess answers it True itself before importing the harness (the one stand-in here), and the
    import must fail naming the fix."""
    import os

    code = "import torch; torch.cuda.is_available = lambda: True; import verl_vllm_rm.dev.cpu_harness.activate"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"})
    assert run.returncode == 1
    assert ("RuntimeError: verl_vllm_rm.dev.cpu_harness.activate is for machines without a GPU and a GPU is visible "
            "here: remove it from VERL_USE_EXTERNAL_MODULES and run with verl's own rollout") in run.stderr
