"""Empty on purpose: older setups named this module in ``VERL_USE_EXTERNAL_MODULES`` to get trainer mode
``vllm_rm_online``.

That setting is no longer needed: the package's ``verl.plugins`` entry point registers every trainer mode
(:mod:`verl_vllm_rm.plugin.trainer_registry`). verl imports each module the variable names at ``import verl`` and
fails if one does not exist, so this one stays, and a run that still names it is warned when the trainer modes
register (:func:`verl_vllm_rm.plugin.verl_seams.warn_old_trainer_mode_module`).
"""
