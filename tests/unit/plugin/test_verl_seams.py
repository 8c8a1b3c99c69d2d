"""verl's private seams (``plugin/verl_seams.py``): the check passes against the installed verl, cheaply; a missing or
changed member stops the trainer modes' registration, and a real start-up, with a message naming the installed
verl, the member and its file, the verl this package was tested with and the fix; and the table cannot rot: each
entry's modules use its member, and every verl member our classes override is an entry."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_paths import PACKAGE



@pytest.fixture(scope="module")
def seams():
    """verl's trainer registry imported (so the trainer modes are registered) and the seams module."""
    import verl.trainer.ppo.v1  # noqa: F401  (its import registers the trainer modes: the check ran once)

    from verl_vllm_rm.plugin import verl_seams

    return verl_seams


def test_the_installed_verl_has_every_seam_and_the_check_is_cheap(seams):
    import verl

    before = set(sys.modules)
    start = time.perf_counter()
    seams.check_verl_seams()
    took = time.perf_counter() - start
    assert set(sys.modules) == before, "the check imported a module"
    assert took < 0.1
    assert verl.__version__ == seams.TESTED_VERL
    assert len(seams.SEAMS) == len({(s.owner, s.member) for s in seams.SEAMS})  # each member listed once


def test_each_seams_file_is_verls(seams):
    import verl

    root = Path(verl.__file__).parent.parent
    assert not [s.name for s in seams.SEAMS if not (root / s.verl_file).is_file()]


def test_a_removed_member_stops_registration_with_what_to_do(seams, monkeypatch):
    import verl
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verl_vllm_rm.plugin import trainer_registry

    registered = []
    monkeypatch.setattr(trainer_registry, "register_trainer", lambda name: registered.append)
    monkeypatch.delattr(PPOTrainer, "_add_batch_to_generate")
    with pytest.raises(seams.VerlSeamError, match="^verl-vllm-rm stands on verl members that the installed") as err:
        trainer_registry.register_trainer_modes()
    message = str(err.value)
    assert f"stands on verl members that the installed verl {verl.__version__} lacks or changed" in message
    assert ("PPOTrainer._add_batch_to_generate (verl/trainer/ppo/v1/trainer_base.py) is gone "
            "[used by verl_vllm_rm/plugin/online_mode.py]") in message
    assert "(this package was tested with verl 0.9.1)" in message
    assert "Install the verl it was tested with (pip install verl==0.9.1), or a verl-vllm-rm release made" in message
    assert registered == []


def test_changed_members_are_named_with_what_changed(seams, monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    def step(self, metrics):  # timing_raw gone
        return None

    def fit(self, agent_loop_manager):  # on_step_end before the checkpoint, and no rollout dump
        self.timing_raw = {}
        self.global_steps += 1
        self.step({}, self.timing_raw)
        self.on_step_end()
        self._save_checkpoint()
        self._consume_sync_metrics()

    def consume(self):  # _pending_sync_metrics read, no longer set
        return self._pending_sync_metrics or {}

    monkeypatch.setattr(PPOTrainer, "step", step)
    monkeypatch.setattr(PPOTrainer, "fit", fit)
    monkeypatch.setattr(PPOTrainer, "_consume_sync_metrics", consume)
    problems = "\n".join(seams.seam_problems())
    assert "PPOTrainer.step (verl/trainer/ppo/v1/trainer_base.py) must take (metrics, timing_raw): it takes " \
           "(metrics)" in problems
    assert "PPOTrainer.fit (verl/trainer/ppo/v1/trainer_base.py) must use step, then _save_checkpoint, then " \
           "on_step_end, then _consume_sync_metrics, then _log_rollout_data: its code no longer uses " \
           "_log_rollout_data" in problems
    assert "PPOTrainer._pending_sync_metrics (verl/trainer/ppo/v1/trainer_base.py) must be set in " \
           "_consume_sync_metrics: PPOTrainer._consume_sync_metrics no longer sets it" in problems
    assert "PPOTrainer.global_steps" not in problems and "PPOTrainer.timing_raw" not in problems  # still set


def test_reordered_calls_and_a_vanished_class_are_caught(seams):
    order = seams.Seam("verl.trainer.ppo.v1.trainer_base", "PPOTrainer", "fit",
                       (seams.Uses(("on_step_end", "_save_checkpoint")),), ("plugin/online_mode.py",))
    gone = seams.Seam("verl.trainer.ppo.v1.trainer_base", "PPOTrainerGone", "fit", (seams.Takes(),),
                      ("plugin/online_mode.py",))
    missing_module = seams.Seam("verl.trainer.ppo.v9", "PPOTrainer", "fit", (seams.Takes(),),
                                ("plugin/online_mode.py",))
    assert seams.seam_problems((order, gone, missing_module)) == [
        "PPOTrainer.fit (verl/trainer/ppo/v1/trainer_base.py) must use on_step_end, then _save_checkpoint: its code "
        "now uses them in the order _save_checkpoint, on_step_end [used by verl_vllm_rm/plugin/online_mode.py]",
        "PPOTrainerGone.fit (verl/trainer/ppo/v1/trainer_base.py) is gone: verl has no class PPOTrainerGone in "
        "verl.trainer.ppo.v1.trainer_base [used by verl_vllm_rm/plugin/online_mode.py]",
        "PPOTrainer.fit (verl/trainer/ppo/v9.py) is gone: verl has no class PPOTrainer in verl.trainer.ppo.v9 "
        "[used by verl_vllm_rm/plugin/online_mode.py]"]


def test_each_entrys_modules_use_its_member(seams):
    """An entry whose module no longer mentions the member (or, for a constructor, the class) is stale."""
    stale = []
    for seam in seams.SEAMS:
        word = seam.owner if seam.member == "__init__" else seam.member
        stale += [f"{seam.name}: {path}" for path in seam.used_by if word not in (PACKAGE / path).read_text()]
    assert not stale


def test_every_verl_member_our_classes_override_is_a_seam(seams):
    """Each method or attribute our subclasses of verl's classes define over a verl one is listed."""
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
    from verl.trainer.ppo.v1 import PPOTrainerSync
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead
    from verl.workers.engine_workers import TrainingWorker

    from verl_vllm_rm.online.engine import RewardModelEngine
    from verl_vllm_rm.online.worker import RewardModelWorker
    from verl_vllm_rm.plugin.online_mode import OnlineRewardModelTraining, RMStepAfterStepEnd, RMStepInStep
    from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer
    from verl_vllm_rm.plugin.trainer_modes import RewardMetrics
    from verl_vllm_rm.scoring.manager import VLLMRewardManager

    ours = {PPOTrainerSync: [RewardMetrics, OnlineRewardModelTraining, RMStepInStep, RMStepAfterStepEnd],
            ReplayBufferAsync: [RMStalenessBuffer], FSDPEngineWithValueHead: [RewardModelEngine],
            TrainingWorker: [RewardModelWorker], RewardManagerBase: [VLLMRewardManager]}
    # verl's reward-manager interface (the registry's documented contract) and the dunders every class has
    # verl's own RewardManagerBase.init_class sets _class_initialized on the subclass at its first instance (an
    # earlier test in the process may have made one): verl's state, not a member we define
    public = {"__init__", "run_single", "assemble_rm_scores", "__doc__", "__module__", "__qualname__",
              "__dict__", "__weakref__", "__annotations__", "__abstractmethods__", "_abc_impl", "_class_initialized"}
    listed = {seam.member for seam in seams.SEAMS}
    def verls(verl_cls: type, name: str) -> bool:
        return any(name in vars(base) for base in verl_cls.__mro__ if base is not object)

    unlisted = [f"{cls.__name__}.{name}" for verl_cls, classes in ours.items() for cls in classes
                for name in vars(cls) if verls(verl_cls, name) and name not in listed | public]
    assert not unlisted


def test_the_old_external_module_is_warned_about(seams, monkeypatch):
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", f"other.module, {seams.OLD_TRAINER_MODE_MODULE}")
    with pytest.warns(DeprecationWarning, match="verl_vllm_rm.online.trainer_mode is no longer needed"):
        assert seams.warn_old_trainer_mode_module()
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "other.module")
    assert not seams.warn_old_trainer_mode_module()


START_UP = """
import json, sys
import verl  # the entry point: the trainer modes register when verl's trainer registry is imported
from verl_vllm_rm.plugin.register import AfterImport

def remove_member():  # verl's trainer module as a verl without _add_batch_to_generate would ship it
    del sys.modules["verl.trainer.ppo.v1.trainer_base"].PPOTrainer._add_batch_to_generate

AfterImport("verl.trainer.ppo.v1.trainer_base", remove_member).install()
try:
    from verl.trainer.ppo.v1 import get_trainer_cls  # what main_ppo's task runner does first
except Exception as e:
    print(json.dumps([type(e).__name__, str(e)]))
"""


def test_a_verl_without_a_member_stops_the_run_at_start_up():
    """In a fresh process, as main_ppo starts: the first import of verl's trainer registry raises the error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL_")}
    proc = subprocess.run([sys.executable, "-c", START_UP], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kind, message = json.loads(proc.stdout.strip().splitlines()[-1])
    assert kind == "VerlSeamError"
    assert "PPOTrainer._add_batch_to_generate (verl/trainer/ppo/v1/trainer_base.py) is gone" in message
    assert "failed to register the trainer modes" in proc.stderr  # logged loudly as well
