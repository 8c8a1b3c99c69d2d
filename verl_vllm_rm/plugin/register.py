"""Entry point of group ``verl.plugins`` (loaded by ``import verl`` in every process,
Ray reward-loop workers included): registers the ``vllm_rm`` reward manager and every
trainer mode of the package: ``vllm_rm`` and its async twins (reward metrics and alarms
in verl's logger) and ``vllm_rm_online`` and its async twins (the RM trained during the run). This is the
only way they are registered: no ``VERL_USE_EXTERNAL_MODULES`` is needed.

The trainer modes are registered when verl's trainer registry (``verl.trainer.ppo.v1``)
is imported, by whichever code imports it first, not here: importing verl's trainer
costs about a second and asks verl for its platform, which the dozen Ray workers that
never build a trainer (reward and agent loops, rollout replicas) should not pay or fix
early. Nothing of verl is changed: the registry module is imported as usual, then
:data:`TRAINER_MODES_MODULE` is imported, which checks the verl members the package stands on
(:mod:`~verl_vllm_rm.plugin.verl_seams`) and registers every trainer mode with verl's
``register_trainer``.

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


_register("verl_vllm_rm.scoring.manager", "'vllm_rm' reward manager")
AfterImport(TRAINER_REGISTRY_MODULE, lambda: _register(TRAINER_MODES_MODULE, "trainer modes")).install()
warn_legacy_argv()
