"""Trainer mode ``vllm_rm_online`` (``plugin/online_mode.py``) with verl's own pieces, around a PPO step.

No PPO step runs here: these tests run what surrounds it for real: the trainer class
built from verl's composed config inside a Ray worker that found it through the
package's ``verl.plugins`` entry point alone (and through an old setup's
``VERL_USE_EXTERNAL_MODULES``, with its warning), and the RM step reading a
step's trajectories from a real TransferQueue, written field by field as verl's
agent loop writes them (``AgentLoopOutput.as_dict`` + ``list_of_dict_to_tensordict``,
padding rows by verl's ``upsample_batch_to_divisible_size``), then training and
publishing into the real server. The RM step after each real PPO step of verl's
``main_ppo`` (one publish per step, parity, checkpoint and resume) is tested in
``tests/integration/dev/test_tiny_ppo_online.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from sync_helpers import PARITY_ATOL, max_diff, reset_server, runtime_version, server_scores
from tq_helpers import put_trajectories

from repo_paths import REPO


RECIPE = REPO / "recipes" / "grpo_math_online_rm.sh"


def read_rollout(batch, reward_key: str | list[str]):
    """A step's rollout as the trainer reads it: the reward metrics' fields and the RM step's, in one read."""
    from verl_vllm_rm.plugin.online_mode import rollout_fields, rollout_of
    from verl_vllm_rm.plugin.trainer_modes import STEP_FIELDS, read_step

    keys = [reward_key] if isinstance(reward_key, str) else reward_key
    return rollout_of(read_step(batch, [*STEP_FIELDS, *rollout_fields(keys)])[1], keys)


def recipe_overrides(**env: str) -> list[str]:
    """The trainer overrides ``recipes/grpo_math_online_rm.sh`` passes to main_ppo."""
    run_env = dict(os.environ, VERL_VLLM_RM_DRY_RUN="1", RM_PATH="/models/rm", **env)
    return subprocess.run(["bash", str(RECIPE)], env=run_env, capture_output=True, text=True,
                          check=True).stdout.splitlines()


OLD_MODULE = "verl_vllm_rm.online.trainer_mode"  # what older setups put in VERL_USE_EXTERNAL_MODULES


@pytest.mark.parametrize("external_modules", ["", OLD_MODULE])
def test_ray_worker_finds_the_trainer_mode_and_it_behaves_as_sync(ray_cluster, compose_config, external_modules):
    """Built like main_ppo's task runner builds it: verl's registry, the recipe's config, in a worker with only
    the entry point; a worker that still names the old module gets the same trainer and a warning to drop it."""
    import cloudpickle
    import ray

    overrides = recipe_overrides()
    assert not [o for o in overrides if "VERL_USE_EXTERNAL_MODULES" in o]
    config = compose_config(overrides)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    @ray.remote(runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": external_modules}})
    def build(config):
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import verl  # noqa: F401  (loads the verl.plugins entry points, and VERL_USE_EXTERNAL_MODULES)
            from verl.trainer.ppo.v1 import get_trainer_cls

        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config)
        said = [str(w.message) for w in caught if "no longer needed" in str(w.message)]
        return type(trainer).__name__, type(trainer.replay_buffer).__name__, trainer.trainer_mode, said

    # verl keys the replay buffer, refill and checkpoints off trainer_mode: "sync", not the async buffer.
    name, buffer, mode, said = ray.get(build.remote(config))
    assert (name, buffer, mode) == ("OnlineRewardModelTrainer", "ReplayBuffer", "sync")
    if external_modules:
        assert len(said) == 1 and f"VERL_USE_EXTERNAL_MODULES={OLD_MODULE} is no longer needed" in said[0]
    else:
        assert said == []


@pytest.fixture(scope="module")
def step_rollout(queue, tokenizer):
    """One PPO step's rollouts: 4 prompts x 3 responses, one right answer each, padded by verl to 16 rows."""
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    groups = {}
    for g, (a, b) in enumerate([(3, 4), (12, 30), (7, 8), (40, 2)]):
        prompt = tokenizer(f"What is {a} + {b}?").input_ids
        groups[f"q{g}"] = [(prompt, tokenizer(f" The answer is {answer}.").input_ids, float(answer == a + b))
                           for answer in (a + b + 1, a + b, a * b)]
    infos = {uid: [{"verifiable_score": score} for *_, score in rows] for uid, rows in groups.items()}
    batch = upsample_batch_to_divisible_size(put_trajectories(queue, groups, infos), 8, tokenizer.eos_token_id)
    assert len(batch) == 16 and sum(tag.get("is_padding", False) for tag in batch.tags) == 4
    return groups, batch


def test_read_rollout_gives_unpadded_sequences_and_either_reward(step_rollout):

    from verl_vllm_rm.online.config import OnlineRMConfig

    groups, batch = step_rollout
    default_key = OnlineRMConfig(model_path="rm", server_url="http://rm").reward_key  # not the RM's own score
    assert default_key == ["verifiable_score"]
    uids, sequences, (rewards,) = read_rollout(batch, default_key)
    rows = [(uid, prompt + response, score) for uid, group in groups.items() for prompt, response, score in group]
    assert (uids, sequences, rewards) == tuple(map(list, zip(*rows)))  # verl's padding rows are skipped
    assert read_rollout(batch, "rm_scores")[2] == [[10 * score for *_, score in rows]]
    # several pair sources: one row of rewards each, in order
    assert read_rollout(batch, ["rm_scores", "verifiable_score"])[2] == [[10 * r for r in rewards], rewards]


def test_a_reward_key_the_rollout_lacks_is_named_with_the_ones_it_has(step_rollout):

    with pytest.raises(KeyError, match=r"reward_key='acc'.*\['verifiable_score'\].*rm_scores"):
        read_rollout(step_rollout[1], "acc")


def test_rm_step_trains_on_a_queued_rollout_and_publishes(step_rollout, compose_config, ws_server, tiny_rm, tokenizer,
                                                         probe_ids):
    """The trainer's RM step on a rollout put in the TransferQueue as verl's agent loop puts it (no PPO step
    runs here): one pair per prompt group, padding rows skipped, a publish per call with parity, and the
    server's scores moved. That this runs after every real PPO step is
    ``tests/integration/dev/test_tiny_ppo_online.py::test_every_step_trains_publishes_and_matches_the_trainer``."""
    from verl_vllm_rm.plugin.online_mode import build_online_rm
    from verl_vllm_rm.plugin.trainer_registry import OnlineRewardModelTrainer
    from verl_vllm_rm.plugin.trainer_modes import read_step

    reset_server(ws_server.url, tiny_rm)
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE

    options = dict(model_path=tiny_rm, server_url=ws_server.url, training_mode="lora", lora_rank=4, lr=5e-3,
                   timeout_s=60, parity_every=1, reward_key="verifiable_score", **CPU_RM_ENGINE)
    config = compose_config(["trainer.v1.trainer_mode=vllm_rm_online", *[f"+online_rm.{k}={v}" for k, v in
                                                                           options.items()]])
    trainer = OnlineRewardModelTrainer(config)
    # what init() adds after verl's setup
    trainer.online_rm, trainer.drift_probe = build_online_rm(config), None
    start = runtime_version(ws_server.url)
    before = server_scores(ws_server.url, probe_ids)
    rollout_sequences = read_rollout(step_rollout[1], "verifiable_score")[1]
    initial = np.array(server_scores(ws_server.url, rollout_sequences))
    for step in (1, 2):
        trainer.global_steps = step  # what verl's fit() counts
        metrics = trainer.train_reward_model(read_step(step_rollout[1], trainer.step_fields())[1])
        assert metrics["rm/pairs"] == 4 and metrics["rm/bt_loss"] > 0  # one pair per prompt group, none of padding
        assert metrics["rm/published_version"] == start + step
        assert metrics["rm/parity_max_abs_diff"] <= PARITY_ATOL
        # drift: the rollout's sequences scored before the first RM step, and by the server after this one
        assert trainer.drift_probe.sequences == rollout_sequences
        assert np.allclose(trainer.drift_probe.initial, initial, atol=1e-5)
        now = np.array(server_scores(ws_server.url, rollout_sequences))
        assert metrics["drift/mean_abs_change"] == pytest.approx(np.abs(now - initial).mean(), abs=1e-5)
        assert metrics["drift/mean_abs_change"] > 0 and -1.0 <= metrics["alarm/drift_rank_corr"] <= 1.0
    served = server_scores(ws_server.url, probe_ids)
    assert max_diff(served, trainer.online_rm.worker_group.reference_scores(probe_ids)[0]) <= PARITY_ATOL
    assert max_diff(served, before) > 1e-3
    assert torch.isfinite(torch.tensor(served)).all()


def online_rm(tiny_rm: str, url: str, mode: str = "lora", **options):
    """An RM trainer worker group (verl's engine, on CPU) that publishes only when told to (resume)."""
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.driver import OnlineRewardModel

    config = OnlineRMConfig.from_dict(dict(model_path=tiny_rm, server_url=url, training_mode=mode, lora_rank=4,
                                           lr=5e-3, timeout_s=60, parity_every=1, publish_every=10**6,
                                           **{**CPU_RM_ENGINE, **options}))
    return OnlineRewardModel(config)


def test_a_step_without_pairs_is_said_at_once_counted_and_max_idle_steps_stops_the_run(step_rollout, ws_server,
                                                                                      tiny_rm, tokenizer, caplog):
    """Every group ties on the pair source (min_reward_gap above every gap): the RM does not train, a warning names
    the pair source and the fix at once, the metrics say so, a step with pairs resets the count, and
    max_idle_steps steps in a row stop the run with the same reason; max_idle_steps=0 never stops it."""
    from verl_vllm_rm.online.driver import RewardModelIdleError

    rollout = read_rollout(step_rollout[1], "verifiable_score")  # 4 groups, one right answer each: gap 1.0
    rm = online_rm(tiny_rm, ws_server.url, min_reward_gap=1.0, max_idle_steps=2)
    with caplog.at_level("WARNING", logger="verl_vllm_rm.online.driver"):
        metrics = rm.train_on_rollout(*rollout, step=1)
    assert metrics == {"rm/pairs": 0.0, "rm/trained": 0.0, "rm/idle_steps": 1.0}
    assert ("online RM: no preference pairs at PPO step 1, so the RM did not train: in all 4 prompt groups the best "
            "and worst responses are within online_rm.min_reward_gap=1 on the pair source "
            "online_rm.reward_key=['verifiable_score']") in caplog.text
    assert "set +online_rm.reward_key to rewards that vary within a group" in caplog.text
    rm.config.min_reward_gap = 0.0  # pairs again: the RM trains and the idle count starts over
    trained = rm.train_on_rollout(*rollout, step=2)
    assert (trained["rm/pairs"], trained["rm/trained"], trained["rm/idle_steps"]) == (4.0, 1.0, 0.0)
    assert trained["rm/pairs_from/verifiable_score"] == 4.0
    rm.config.min_reward_gap = 1.0
    assert rm.train_on_rollout(*rollout, step=3)["rm/idle_steps"] == 1.0
    with pytest.raises(RewardModelIdleError, match=r"no preference pairs at PPO step 4.*That is 2 step\(s\) in a "
                                                   r"row, online_rm.max_idle_steps=2: stopping the run"):
        rm.train_on_rollout(*rollout, step=4)
    rm.config.max_idle_steps = 0  # never stops: the count goes on past the old limit
    assert [rm.train_on_rollout(*rollout, step=s)["rm/idle_steps"] for s in (5, 6, 7)] == [3.0, 4.0, 5.0]


@pytest.fixture(scope="module")
def trained_lora(step_rollout, ws_server, tiny_rm, probe_ids, tmp_path_factory):
    """A LoRA RM trainer (1 rank) after two steps on the step's rollout, its checkpoint (verl's
    ``global_step_2`` folder) and its scores of the probe set then; the rollout it trained on. The trainer is the
    module's: a test may train it on (the checkpoint and the scores stay those of step 2)."""
    from verl_vllm_rm.plugin.online_mode import RM_CHECKPOINT_DIR

    rollout = read_rollout(step_rollout[1], "verifiable_score")
    first = online_rm(tiny_rm, ws_server.url)
    for _ in range(2):
        first.train_on_rollout(*rollout)
    folder = tmp_path_factory.mktemp("resume") / "global_step_2"
    first.save_checkpoint(str(folder / RM_CHECKPOINT_DIR))
    return first, folder, first.worker_group.reference_scores(probe_ids)[0], rollout


def test_resume_restores_the_rm_and_its_optimizer_and_republishes(trained_lora, ws_server, tiny_rm, probe_ids):
    from verl_vllm_rm.plugin.online_mode import resume_reward_model

    first, folder, trained, rollout = trained_lora
    reset_server(ws_server.url, tiny_rm)  # as after a restart: the server serves the initial RM
    assert max_diff(server_scores(ws_server.url, probe_ids), trained) > 1e-3
    resumed = online_rm(tiny_rm, ws_server.url)
    metrics = resume_reward_model(resumed, str(folder))
    assert metrics["rm/parity_max_abs_diff"] <= PARITY_ATOL  # probed on the last step's chosen responses
    assert max_diff(server_scores(ws_server.url, probe_ids), trained) <= PARITY_ATOL
    assert max_diff(resumed.worker_group.reference_scores(probe_ids)[0], trained) == 0

    # AdamW's moments came back too: one more step moves both models identically.
    first.train_on_rollout(*rollout)
    resumed.train_on_rollout(*rollout)
    after = first.worker_group.reference_scores(probe_ids)[0]
    assert max_diff(after, trained) > 1e-3
    assert max_diff(resumed.worker_group.reference_scores(probe_ids)[0], after) <= 1e-6


def test_resume_refuses_another_modes_state_and_falls_back_to_the_initial_rm(trained_lora, ws_server, tiny_rm,
                                                                            probe_ids, hf_model, tmp_path, caplog):
    from verl_vllm_rm.parity.reference import sequence_scores
    from verl_vllm_rm.plugin.online_mode import resume_reward_model

    lora, folder = trained_lora[:2]  # its checkpoint holds 1 rank's state in training_mode=lora
    full = online_rm(tiny_rm, ws_server.url, mode="full")
    with pytest.raises(Exception, match=r"saved by 1 RM rank\(s\) in training_mode=lora; this run has 1 in full.*"
                                        "resume with the same"):
        resume_reward_model(full, str(folder))

    # A checkpoint without RM state: the initial RM continues, and the server is brought back to it.
    lora.resume(None)  # the server now serves the trained LoRA model
    initial = sequence_scores(hf_model, probe_ids)
    served = server_scores(ws_server.url, probe_ids)
    assert max_diff(served, lora.worker_group.reference_scores(probe_ids)[0]) <= PARITY_ATOL
    assert max_diff(served, initial) > 1e-3, "the server must differ from the initial RM before the fallback"
    with caplog.at_level("WARNING", logger="verl_vllm_rm.plugin.online_mode"):
        resume_reward_model(full, str(tmp_path / "global_step_7"))
    assert "no online RM state" in caplog.text
    assert max_diff(server_scores(ws_server.url, probe_ids), initial) <= PARITY_ATOL


def test_the_drift_probe_scores_on_the_listed_server_with_the_newest_version(rm_server, ws_server, dead_url):
    """With ``on_server_failure=leave_behind`` a listed server may be behind or down: the probe asks each one's
    ``/health`` and takes the first on the newest version; none answering is an error naming the list."""
    from sync_helpers import runtime_version

    from verl_vllm_rm.client.reward_client import RewardServerError
    from verl_vllm_rm.plugin.online_mode import newest_server

    newer = max((rm_server.url, ws_server.url), key=runtime_version)
    assert newest_server([dead_url, rm_server.url, ws_server.url], None) == newer
    assert newest_server([dead_url], None) == dead_url  # the only one: not asked
    with pytest.raises(RewardServerError, match=rf"none of online_rm.server_url \['{dead_url}', '{dead_url}/'\] "
                                                r"answered /health ok within 5 s with its weight version"):
        newest_server([dead_url, dead_url + "/"], None)
