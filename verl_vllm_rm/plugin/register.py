"""Entry point of group ``verl.plugins`` (loaded by ``import verl`` in every process,
Ray reward-loop workers included): registers the ``vllm_rm`` reward manager and every
trainer mode of the package: ``vllm_rm`` and its async twins (reward metrics and alarms
in verl's logger) and ``vllm_rm_online`` and its async twins (the RM trained during the run). This is the
only way they are registered: no ``VERL_USE_EXTERNAL_MODULES`` is needed.

Each is registered when verl's registry of its kind is imported, by whichever code imports it first, not here:
the reward manager with verl's reward-manager package (:data:`REWARD_MANAGER_MODULE`, which every lookup of a
manager's name imports), the trainer modes with verl's trainer registry (:data:`TRAINER_REGISTRY_MODULE`).
Importing the manager costs about 1.5 CPU-seconds (verl's reward loop, the HTTP client) and verl's trainer about
a second, and the trainer asks verl for its platform: the Ray workers that never score (the driver, the actor and
rollout workers) or never build a trainer (reward and agent loops, rollout replicas) should not pay for them or
fix the platform early. Nothing of verl is changed: its module is imported as usual, then ours is. The trainer
modes' module (:data:`TRAINER_MODES_MODULE`) first checks the verl members the package stands on
(:mod:`~verl_vllm_rm.plugin.verl_seams`), then registers every trainer mode with verl's ``register_trainer``.

verl logs a failing plugin import only at DEBUG, so failures are reported here
loudly before being re-raised.
"""

import importlib
import importlib.abc
import importlib.util
import logging
import sys

from verl_vllm_rm.scoring.misrouted_config import warn_legacy_argv

log = logging.getLogger("verl_vllm_rm")
#: verl's reward-manager package: its ``register`` and ``get_reward_manager_cls`` (every lookup of a name imports it)
REWARD_MANAGER_MODULE = "verl.experimental.reward_loop.reward_manager"
#: registers the ``vllm_rm`` reward manager when imported
MANAGER_MODULE = "verl_vllm_rm.scoring.manager"
TRAINER_REGISTRY_MODULE = "verl.trainer.ppo.v1"
#: registers every trainer mode (trainer.v1.trainer_mode=vllm_rm[_online][_<async mode>]) when imported
TRAINER_MODES_MODULE = "verl_vllm_rm.plugin.trainer_registry"


def _register(module: str, what: str) -> None:
    # A module already in sys.modules is registering itself (the user imported it first, it imported verl,
    # verl loaded this plugin while it was half-initialised) or has done so: its last line registers.
    if module in sys.modules:
        return
    try:
        importlib.import_module(module)
    except Exception:  # the message is the point
        log.exception("verl-vllm-rm: failed to register the %s", what)
        raise


class AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Once ``module`` has been imported (by anyone), import ``then``. Removes itself after the first use."""

    def __init__(self, module: str, then) -> None:
        self.module, self.then, self.loader = module, then, None

    def find_spec(self, name, path, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its own loader
        self.loader.exec_module(module)
        self.then()

    def install(self) -> None:
        if self.module in sys.modules:
            self.then()
        elif self not in sys.meta_path:
            sys.meta_path.insert(0, self)


AfterImport(REWARD_MANAGER_MODULE, lambda: _register(MANAGER_MODULE, "'vllm_rm' reward manager")).install()
AfterImport(TRAINER_REGISTRY_MODULE, lambda: _register(TRAINER_MODES_MODULE, "trainer modes")).install()
warn_legacy_argv()
