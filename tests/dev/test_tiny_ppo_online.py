"""Trainer mode ``vllm_rm_online`` in verl's real ``main_ppo``, the RM on two replicas the plugin starts and
manages on verl's Ray cluster: one RM step per PPO step, published to both replicas and parity-probed; RM state and
the RM's whitening statistics in verl's checkpoints and a resumed run (whose fresh replicas get the restored RM
before its first score); an unreachable reward server (one killed mid-run: test_tiny_ppo.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ppo_runs import expected_totals, generations, tiny_ppo

from verl_vllm_rm.dev.ppo_report import read_dump, read_metrics
from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, TinyPPOError, run_tiny_ppo

pytestmark = [pytest.mark.server, pytest.mark.ray]

RM_RANKS = 2  # the RM trains sharded over two ranks of verl's engine (FSDP2)


@pytest.fixture(scope="module")
def online_runs(tmp_path_factory, tiny_rm, tiny_task):
    """2 online steps (a checkpoint each), then the same run resumed to step 3; each run starts its own two
    replicas (weight version 0); the RM's scores are whitened (running statistics, two reward-loop workers)."""
    work = tmp_path_factory.mktemp("ppo_online")
    common = dict(online="full", validate=False, replicas=2,
                  extra_overrides=["trainer.save_freq=1", "+reward.reward_kwargs.whiten=running",
                                   f"+online_rm.num_workers={RM_RANKS}"])
    first = tiny_ppo(work, tiny_rm, tiny_task["policy"], None, steps=2, **common)
    first["metrics"] = dict(read_metrics(work))  # the resumed run writes its own metrics file
    resumed = tiny_ppo(work, tiny_rm, tiny_task["policy"], None, steps=3, **common)
    resumed["metrics"] = dict(read_metrics(work))
    return work, first, resumed


def replica_metrics(metrics: dict, replica: int) -> dict[str, float]:
    prefix = f"replicas/rm/{replica}/"
    return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix)}


def test_every_step_trains_publishes_to_both_replicas_and_matches_the_trainer(online_runs):
    """One publish per PPO step, to both replicas (two-phase), and the worst replica's parity within 1e-4."""
    _, first, _ = online_runs
    assert [s["rm_version"] for s in first["steps"]] == [1, 2]
    for s in first["steps"]:
        assert s["parity_max_abs"] is not None and s["parity_max_abs"] <= 1e-4, s
        assert first["metrics"][s["step"]]["rm/publish_servers"] == 2
    for step in (1, 2):  # read before the step's RM update: both routed, on the previous step's version
        for i in (0, 1):
            m = replica_metrics(first["metrics"][step], i)
            assert m["routed"] == 1.0 and m["version"] == step - 1 and m["failures"] == 0.0, m
    assert all(sum(replica_metrics(first["metrics"][step], i)["inputs"] for step in (1, 2)) > 0 for i in (0, 1))


def test_each_rm_rank_holds_half_of_the_rms_training_state(online_runs, tiny_rm):
    """``full`` on 2 ranks of verl's engine: per step, each rank's parameters + gradients + Adam's moments (fp32,
    16 bytes a parameter: what one rank holds alone) are half of the RM's, read from the engine's own shards."""
    from transformers import AutoModelForSequenceClassification

    whole = 16 * sum(p.numel() for p in AutoModelForSequenceClassification.from_pretrained(tiny_rm).parameters())
    _, first, _ = online_runs
    for step in (1, 2):
        m = first["metrics"][step]
        assert m["rm/ranks"] == RM_RANKS and m["rm/state_bytes_all_ranks"] == pytest.approx(whole, rel=0.01)
        assert m["rm/state_bytes"] == pytest.approx(whole / RM_RANKS, rel=0.01)


def test_online_steps_log_reward_metrics_the_weight_version_and_drift(online_runs):
    """vllm_rm_online has trainer mode vllm_rm's metrics; step N's rollouts were scored by the weights published
    after step N-1; the RM's drift on the probe set is measured every step and moves once the RM has trained."""
    _, first, _ = online_runs
    metrics = first["metrics"]
    for step in (1, 2):
        m = metrics[step]
        assert m["reward/rm_valid_share"] == 1.0 and "reward/rm_score/mean" in m and "alarm/dead_groups" in m
        assert m["reward/rm_weight_version/min"] == m["reward/rm_weight_version/max"] == step - 1
        assert m["drift/mean_abs_change"] >= 0 and -1.0 <= m["alarm/drift_rank_corr"] <= 1.0
    assert max(metrics[s]["drift/mean_abs_change"] for s in (1, 2)) > 0


def rm_at(folder) -> tuple[torch.nn.Module, int]:
    """The RM of verl's checkpoint of the RM engine in ``folder`` (joined from its ranks' shards), and the RM
    steps it had taken."""
    from verl_vllm_rm.online.export import load_trained_rm, rm_run_state

    state = rm_run_state(folder)
    assert (state["world_size"], state["training_mode"]) == (RM_RANKS, "full")
    return load_trained_rm(folder), state["steps"]


def test_rm_state_is_in_verls_checkpoint_and_the_resumed_replicas_score_with_it(online_runs, tiny_rm):
    """The resumed run's replicas are new (version 0): the trainer starts them at set-up and publishes the RM
    restored from global_step_2 to both before anything is scored, so every step-3 RM score is that RM's score of
    the exact tokens verl generated; step 3 then publishes again, with parity."""
    from transformers import AutoTokenizer

    from verl_vllm_rm.parity.reference import sequence_scores

    work, _, resumed = online_runs
    for step in (1, 2, 3):
        folder = work / "checkpoints" / f"global_step_{step}" / "online_rm"
        assert [(folder / f"model_world_size_{RM_RANKS}_rank_{r}.pt").is_file() for r in range(RM_RANKS)] == [True] * 2
    assert [s["step"] for s in resumed["steps"]] == [3]  # verl resumed from global_step_2
    assert resumed["steps"][0]["rm_version"] == 2  # the resume published 1, step 3 published 2
    assert resumed["steps"][0]["parity_max_abs"] <= 1e-4
    for i in (0, 1):
        m = replica_metrics(resumed["metrics"][3], i)
        assert m["routed"] == 1.0 and m["version"] == 1.0 and m["restarts"] == 0.0, m
    restored, steps = rm_at(work / "checkpoints" / "global_step_2" / "online_rm")
    assert steps == 2 and rm_at(work / "checkpoints" / "global_step_3" / "online_rm")[1] == 3
    tokenizer = AutoTokenizer.from_pretrained(resumed["policy"])
    dump = read_dump(work, 3)
    rows = expected_totals(dump, generations(work), tokenizer, lambda seqs: sequence_scores(restored, seqs))
    assert len(rows) == 16
    for row, candidates, _ in rows:
        assert min(abs(row["rm_score_rm"] - c) for c in candidates) <= 1e-4, (row["rm_score_rm"], candidates)


def test_whitening_statistics_are_saved_with_the_rm_and_continue_in_the_resumed_run(online_runs):
    """Each checkpoint's whitening.json (beside the RM's state) holds the running statistics of every raw RM
    score of the run so far, merged over both reward-loop workers; the resumed run's workers started from step 2's
    file, so step 3's counts every score of steps 1-3 once."""
    work = online_runs[0]
    raw = {step: [row["rm_score_rm"] for row in read_dump(work, step)] for step in (1, 2, 3)}
    for step in (1, 2, 3):
        path = work / "checkpoints" / f"global_step_{step}" / "online_rm" / "whitening.json"
        saved = json.loads(path.read_text())["reward_models"]["rm"]
        seen = np.array([x for s in range(1, step + 1) for x in raw[s]], dtype=float)
        assert saved["count"] == len(seen) == 16 * step
        assert saved["mean"] == pytest.approx(seen.mean(), abs=1e-6)
        assert saved["m2"] == pytest.approx(((seen - seen.mean()) ** 2).sum(), rel=1e-6)
    # the whitened score is what the ensemble (here: the one RM) used
    row = read_dump(work, 3)[0]
    assert row["rm_score"] == pytest.approx(row["rm_scaled_rm"])


def test_unreachable_server_stops_the_run_naming_it(tmp_path, tiny_rm, tiny_task, dead_url):
    """No retry can help: main_ppo stops with the plugin's error naming the server, and no step trained."""
    cfg = TinyPPOConfig(tmp_path / "dead", steps=2, rm=tiny_rm, policy=str(tiny_task["policy"]),
                        server_url=dead_url, validate=False,
                        extra_overrides=["+reward.reward_kwargs.max_retries=1",
                                         "+reward.reward_kwargs.deadline_s=5"])
    with pytest.raises(TinyPPOError) as err:
        run_tiny_ppo(cfg, on_step=None)
    assert "main_ppo exited with code" in str(err.value)
    log = (cfg.work_dir / "main_ppo.log").read_text(errors="replace")
    assert "RewardServerError" in log and dead_url.split("//")[1] in log
    assert not [step for step, m in read_metrics(cfg.work_dir) if "training/global_step" in m]
