"""Applies the CPU harness: importing this module makes verl 0.9.1's own ``main_ppo`` run without a GPU.

Load it in every verl process with ``VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.dev.cpu_harness.activate``
(first in the list; ``verl-vllm-rm tiny-ppo`` does). It registers a ``cpu`` platform and the
``hf_cpu`` rollout backend and applies the patches listed in :mod:`.patches`. It refuses to load
where CUDA is available, so it can never change what a GPU run does.
"""

import importlib
import os
import sys

import torch

if torch.cuda.is_available():
    raise RuntimeError(
        "verl_vllm_rm.dev.cpu_harness.activate is for machines without a GPU and a GPU is visible here: "
        "remove it from VERL_USE_EXTERNAL_MODULES and run with verl's own rollout (e.g. rollout.name=vllm)"
    )

_ENV = "VERL_USE_EXTERNAL_MODULES"
_later: list[str] = []
if "verl" not in sys.modules:
    # A process whose first import is this module (a Ray actor unpickling an hf_cpu class) imports
    # verl below, and verl then imports every module in VERL_USE_EXTERNAL_MODULES. One of them may
    # ask verl for its platform at import time (verl_vllm_rm.online.trainer_mode does, through
    # verl's trainer), before the cpu platform exists: verl imports only this module then, and
    # the others follow once the patches are in.
    _modules = os.environ.get(_ENV, "")
    _later = [m for m in _modules.split(",") if m and m != __name__]
    os.environ[_ENV] = __name__
    try:
        import verl  # noqa: F401
    finally:
        os.environ[_ENV] = _modules

from verl_vllm_rm.dev.cpu_harness.patches import PATCHES, apply_all  # noqa: E402

apply_all()
for _module in _later:
    importlib.import_module(_module)

__all__ = ["PATCHES"]
