"""Opt-in: makes verl 0.9.1's own ``main_ppo`` run on a machine without a GPU.

Load it in every verl process with ``VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.dev.cpu_harness``
(``verl-vllm-rm tiny-ppo`` does). It registers a ``cpu`` platform and the ``hf_cpu``
rollout backend and applies the patches listed in :mod:`.patches`. It refuses to
load where CUDA is available, so it can never change what a GPU run does.
"""

import torch

from verl_vllm_rm.dev.cpu_harness.patches import PATCHES, apply_all

if torch.cuda.is_available():
    raise RuntimeError(
        "verl_vllm_rm.dev.cpu_harness is for machines without a GPU and a GPU is visible here: "
        "remove it from VERL_USE_EXTERNAL_MODULES and run with verl's own rollout (e.g. rollout.name=vllm)"
    )

apply_all()

__all__ = ["PATCHES"]
