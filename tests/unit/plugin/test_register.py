"""How a fresh verl process finds ``vllm_rm`` (``plugin/register.py``, the ``verl.plugins`` entry point): the reward
manager registers when verl's reward-manager package is imported and the trainer modes when verl's trainer registry
is, each through an import hook that runs once and leaves the module its own loader; a failed registration is
logged before it is raised (the reward manager found in a fresh process and ``VERL_USE_EXTERNAL_PLUGINS=none``:
tests/integration/plugin/test_register.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from verl_vllm_rm.plugin.register import AfterImport, _register

#: one fresh interpreter for both registrations (an ``import verl`` costs ~7 CPU-s): what ``import verl`` alone
#: imported, then each registry's first lookup and the loader its module keeps
FRESH_PROCESS_PROBE = """
import json, sys, verl
lazy = ("verl.trainer.ppo.v1", "verl.experimental.reward_loop.reward_manager", "verl_vllm_rm.scoring.manager")
before = {name: name in sys.modules for name in lazy}
from verl.trainer.ppo.v1 import get_trainer_cls
import verl.trainer.ppo.v1 as v1
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
import verl.experimental.reward_loop.reward_manager as managers
print(json.dumps({"imported_by_import_verl": before,
                  "trainer_mode": [get_trainer_cls("vllm_rm").__name__, type(v1.__loader__).__name__],
                  "reward_manager": [get_reward_manager_cls("vllm_rm").__name__,
                                     type(managers.__loader__).__name__]}))
"""


@pytest.fixture(scope="module")
def fresh_process() -> dict:
    """:data:`FRESH_PROCESS_PROBE`'s answer from a fresh interpreter found by the ``verl.plugins`` entry point
    alone (``VERL_USE_EXTERNAL_MODULES`` unset)."""
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}
    proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS_PROBE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_trainer_mode_is_registered_when_verls_trainer_is_imported_not_before(fresh_process):
    """``import verl`` alone leaves verl's trainer unimported (reward and agent-loop workers never pay for it);
    the first import of verl's trainer registry registers trainer mode ``vllm_rm``, and the module keeps its
    own loader."""
    assert fresh_process["imported_by_import_verl"]["verl.trainer.ppo.v1"] is False
    assert fresh_process["trainer_mode"] == ["RewardMetricsPPOTrainerSync", "SourceFileLoader"]


def test_the_reward_manager_is_registered_when_verls_manager_package_is_imported_not_before(fresh_process):
    """``import verl`` alone imports neither verl's reward loop nor our manager (the driver and the actor and rollout
    workers, which never score, save ~1.5 CPU-s each); the first import of verl's reward-manager package, which every
    lookup of a manager's name makes, registers ``vllm_rm``, and the package keeps its own loader."""
    before = fresh_process["imported_by_import_verl"]
    assert [before["verl.experimental.reward_loop.reward_manager"], before["verl_vllm_rm.scoring.manager"]] == [
        False, False]
    assert fresh_process["reward_manager"] == ["VLLMRewardManager", "SourceFileLoader"]


@pytest.fixture()
def probe_module(tmp_path, monkeypatch):
    """The name of a module on ``sys.path`` that nothing has imported yet (forgotten again after the test)."""
    (tmp_path / "register_probe_module.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "register_probe_module"
    sys.modules.pop("register_probe_module", None)


def test_the_hook_runs_once_the_module_is_imported_then_removes_itself(probe_module):
    import importlib

    seen = []
    hook = AfterImport(probe_module, lambda: seen.append(sys.modules[probe_module].VALUE))
    hook.install()
    hook.install()  # installed once
    assert seen == [] and sys.meta_path.count(hook) == 1
    module = importlib.import_module(probe_module)
    assert seen == [7] and hook not in sys.meta_path  # ran after the module's own code, once
    assert type(module.__loader__).__name__ == "SourceFileLoader"  # the module keeps its own loader
    AfterImport(probe_module, lambda: seen.append("at once")).install()  # already imported: runs now
    assert seen == [7, "at once"]


def test_a_failed_registration_is_logged_loudly_and_raised(caplog):
    with pytest.raises(ModuleNotFoundError, match="register_no_such_module"):
        _register("register_no_such_module", "probe modes")
    assert "verl-vllm-rm: failed to register the probe modes" in caplog.text
    _register("json", "modules already imported")  # in sys.modules: nothing to do
