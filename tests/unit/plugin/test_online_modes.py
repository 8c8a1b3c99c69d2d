"""Trainer modes ``vllm_rm_online[_<async mode>]`` (``plugin/online_mode.py``): ``online_rm.max_staleness``'s
replay buffer, and two paths of the asynchronous modes no ``main_ppo`` run
of ``make test`` takes: the early submission of the next step's prompts skipped after the last step and under
verl's rollout skip, and a resumed run's eviction of the groups restored with verl's TransferQueue.

Where the RM step runs is shown by real ``main_ppo`` runs: inside verl's step in the sync mode
(``tests/integration/dev/test_tiny_ppo_online.py``), after verl's ``on_step_end`` with generation going on and before the
checkpoint on a save step in both asynchronous modes (``tests/integration/dev/test_tiny_ppo_any_rm.py``, run in each). The two
paths here are checked on verl's own trainer classes built from verl's composed config (no Ray: verl's constructor
starts nothing), with what a real step would do around the hooks (verl's step, the RM worker group, the policy's
weight sync) recorded in order: a run reaching them would need a rollout skip or a resumed asynchronous run of its
own (~4 minutes of ``make test`` each).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from verl_vllm_rm.options import ConfigError

ONLINE = ["reward.reward_manager.name=vllm_rm", "+online_rm.model_path=/rm"]
# verl's separate_async refuses its defaults (see tests/integration/plugin/test_metrics_trainer_mode.py)
SEPARATE = ["trainer.v1.separate_async.parameter_sync_step=4", "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
MODES = {"vllm_rm_online": [], "vllm_rm_online_colocate_async": [], "vllm_rm_online_separate_async": SEPARATE}


def build(compose_config, mode: str, *overrides: str):
    from verl.trainer.ppo.v1 import get_trainer_cls

    return get_trainer_cls(mode)(compose_config([f"trainer.v1.trainer_mode={mode}", *ONLINE, *MODES[mode],
                                                 *overrides]))


@pytest.mark.parametrize("mode", ["vllm_rm_online_colocate_async", "vllm_rm_online_separate_async"])
def test_max_staleness_gives_verls_async_buffer_with_rm_staleness(compose_config, mode):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer

    assert type(build(compose_config, mode).replay_buffer) is ReplayBufferAsync  # no bound asked: verl's own
    trainer = build(compose_config, mode, "+online_rm.max_staleness=2", "algorithm.filter_groups.enable=true",
                    "algorithm.filter_groups.metric=acc")
    buffer = trainer.replay_buffer
    assert type(buffer) is RMStalenessBuffer and buffer.max_staleness == 2 and buffer.floor is None
    assert buffer.version_keys == ("rm_weight_version",) and buffer.trainer_mode == mode.rsplit("online_")[1]
    # verl's own settings, DAPO's group filter included
    assert buffer.filter_groups_metric == "acc" and buffer.refill_fn == trainer._add_prompts_to_generate
    assert buffer.max_off_policy_threshold == trainer.config.trainer.v1.sampler.max_off_policy_threshold


def test_max_staleness_is_refused_where_it_cannot_apply(compose_config):
    with pytest.raises(ConfigError, match=r"trainer mode 'vllm_rm_online' \(verl's sync trainer\) publishes between "
                                          r"steps.*drop \+online_rm.max_staleness, or train in "
                                          r"vllm_rm_online_colocate_async or vllm_rm_online_separate_async"):
        build(compose_config, "vllm_rm_online", "+online_rm.max_staleness=1")
    with pytest.raises(ConfigError, match="online_rm: max_staleness must be >= 1, got 0"):
        build(compose_config, "vllm_rm_online_colocate_async", "+online_rm.max_staleness=0")
    with pytest.raises(ConfigError, match=r"and trainer.v1.sampler.custom_sampler names another \(Mine\): drop one"):
        build(compose_config, "vllm_rm_online_colocate_async", "+online_rm.max_staleness=1",
              "trainer.v1.sampler.custom_sampler.path=pkg://x", "trainer.v1.sampler.custom_sampler.name=Mine")


@pytest.fixture
def recorded(monkeypatch):
    """What verl and the RM worker group would do around the hooks, recorded in order; an RM step publishes
    version 7 (``rm/published_version``)."""
    from verl_vllm_rm.plugin import online_mode
    from verl_vllm_rm.plugin.trainer_modes import RewardMetrics

    events: list[str] = []

    def verl_step(trainer, metrics, timing_raw):
        events.append("ppo_step")
        trainer.step_data = {"uid": ["a"]}
        return "batch"

    online_rm = SimpleNamespace(
        config=SimpleNamespace(reward_key=["verifiable_score"]),
        train_on_rollout=lambda *rollout, step: events.append("rm_step") or {"rm/pairs": 4.0,
                                                                              "rm/published_version": 7.0},
        save_checkpoint=lambda path: events.append("rm_save"))
    monkeypatch.setattr(RewardMetrics, "init", lambda trainer: None)  # verl's set-up: workers, resume
    monkeypatch.setattr(RewardMetrics, "step", verl_step)
    monkeypatch.setattr(RewardMetrics, "_save_checkpoint", lambda trainer: events.append("verl_save"))
    monkeypatch.setattr(RewardMetrics, "_add_batch_to_generate", lambda trainer: events.append("submit_prompts"),
                        raising=False)  # verl's: the prompts of a step, to the rollout
    monkeypatch.setattr(online_mode, "build_online_rm", lambda config, pool: online_rm)
    monkeypatch.setattr(online_mode, "actor_resource_pool", lambda trainer: None)
    monkeypatch.setattr(online_mode, "rollout_of", lambda data, keys: (data["uid"], [[1, 2]], [[1.0]]))
    monkeypatch.setattr(online_mode, "make_drift_probe",
                        lambda config, sequences: SimpleNamespace(measure=lambda: {"rm/drift": 0.0}))
    return events


def start(compose_config, mode: str, events: list[str], *overrides: str):
    """The trainer after verl's set-up, at step 1 (fit's counters), its weight syncs recorded."""
    trainer = build(compose_config, mode, *overrides)
    trainer.global_steps = 0  # a fresh run (verl's set-up resumes nothing)
    trainer.init()
    trainer.global_steps, trainer.timing_raw, trainer.prev_step_profile = 1, {}, False
    trainer.total_training_steps = 3
    sync = SimpleNamespace(update_weights=lambda step: events.append("policy_sync") or {"sync/bytes": 1.0},
                           resume_generation_replicas=lambda: events.append("resume_generation"))
    trainer.checkpoint_manager = trainer.standalone_checkpoint_manager = sync
    return trainer


@pytest.mark.parametrize("mode", ["vllm_rm_online_colocate_async", "vllm_rm_online_separate_async"])
def test_the_next_steps_prompts_are_submitted_before_the_rm_step_and_once(compose_config, recorded, mode):
    """verl submits a step's prompts in its prepare_step; the step before submitted them already, before its RM
    step, so prepare_step submits none. Not after the last step, nor under verl's rollout skip (it keys a
    submission by the step making it): there the next step submits its own."""
    trainer = start(compose_config, mode, recorded)
    trainer.step({}, trainer.timing_raw)
    trainer.on_step_end()
    assert recorded.count("submit_prompts") == 1 and recorded.index("submit_prompts") < recorded.index("rm_step")
    trainer._add_batch_to_generate()  # step 2's prepare_step: submitted already
    assert recorded.count("submit_prompts") == 1
    trainer._add_batch_to_generate()  # step 3's (step 2 submitted nothing early): its own
    assert recorded.count("submit_prompts") == 2
    recorded.clear()
    trainer.global_steps = trainer.total_training_steps
    trainer.step({}, trainer.timing_raw)
    trainer.on_step_end()
    assert "submit_prompts" not in recorded and "rm_step" in recorded
    recorded.clear()
    trainer.global_steps = 1
    trainer.config.skip.rollout_tq.enable = True
    trainer.step({}, trainer.timing_raw)
    trainer.on_step_end()
    assert "submit_prompts" not in recorded and "rm_step" in recorded


def test_a_resumed_async_run_evicts_the_restored_groups_and_floors_at_the_resumed_rm(compose_config, recorded,
                                                                                   monkeypatch):
    from verl_vllm_rm.plugin import online_mode
    from verl_vllm_rm.plugin.rm_staleness import RMStalenessBuffer

    monkeypatch.setattr(RMStalenessBuffer, "retire_finished_groups", lambda buffer: recorded.append("retire") or 2)
    monkeypatch.setattr(online_mode, "resume_reward_model",
                        lambda rm, folder: recorded.append("rm_resume") or {"rm/published_version": 1.0})
    trainer = build(compose_config, "vllm_rm_online_colocate_async", "+online_rm.max_staleness=3")
    trainer.global_steps = 4  # verl's set-up resumed step 4 (and restored its TransferQueue)
    trainer.init()
    assert recorded == ["retire", "rm_resume"] and trainer.replay_buffer.floor == -1  # 1 - 3 + 1
