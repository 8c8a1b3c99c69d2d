"""The trainer modes registered with verl (``plugin/trainer_registry.py``): every mode of verl's has a ``vllm_rm``
mode and an online one, each a named subclass of verl's own, found by verl's ``get_trainer_cls``."""

from __future__ import annotations

import sys


def test_every_mode_of_verls_has_an_online_one():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from verl_vllm_rm.plugin.online_mode import OnlineRewardModelTraining, RMStepAfterStepEnd, RMStepInStep
    from verl_vllm_rm.plugin.trainer_registry import TRAINER_MODES

    for base in ("sync", "colocate_async", "separate_async"):
        suffix = "" if base == "sync" else f"_{base}"
        timing = RMStepInStep if base == "sync" else RMStepAfterStepEnd
        online = get_trainer_cls(f"vllm_rm_online{suffix}")
        assert online is TRAINER_MODES[f"vllm_rm_online{suffix}"] and online.base_mode == base
        assert online.__mro__[1:4] == (timing, OnlineRewardModelTraining, get_trainer_cls(f"vllm_rm{suffix}"))


def test_each_vllm_rm_mode_is_a_named_subclass_of_verls_own_trainer_registered_with_verl():
    from verl.trainer.ppo.v1 import get_trainer_cls

    from verl_vllm_rm.plugin.trainer_registry import TRAINER_MODES

    assert len(TRAINER_MODES) == 6
    for name, cls in TRAINER_MODES.items():
        base = name.removeprefix("vllm_rm").removeprefix("_online").removeprefix("_") or "sync"
        assert get_trainer_cls(name) is cls
        assert issubclass(cls, get_trainer_cls(base)) and cls is not get_trainer_cls(base)
        # a class statement of the plugin's, importable by its name (not one built at run time)
        assert cls.__module__.startswith("verl_vllm_rm.plugin.") and cls.__qualname__ == cls.__name__
        assert getattr(sys.modules[cls.__module__], cls.__name__) is cls
