"""The module path older setups put in ``VERL_USE_EXTERNAL_MODULES`` to get trainer mode ``vllm_rm_online``.

That setting is no longer needed: the package's ``verl.plugins`` entry point registers every
trainer mode (:mod:`verl_vllm_rm.plugin.register`), in every process that imports verl. verl
imports the modules this variable names before it loads the entry points, so a run that still
sets it gets ``vllm_rm_online`` from the entry point as before, and this warning.
"""

import logging
import warnings

MESSAGE = ("verl-vllm-rm: VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.online.trainer_mode is no longer needed: the "
           "package's verl.plugins entry point registers trainer mode vllm_rm_online; drop it from the environment "
           "(and from ray_kwargs.ray_init.runtime_env.env_vars)")

logging.getLogger("verl_vllm_rm").warning(MESSAGE)
warnings.warn(MESSAGE, DeprecationWarning, stacklevel=2)
