"""Two reward models in verl's real ``main_ppo`` (GRPO on CPU through the harness): each dumped reward is the
uncertainty-penalised ensemble of both servers' scores of the exact token ids verl generated (the second RM's
whitened), plus the rules; the whitening statistics are in the run's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ppo_runs import expected_totals, generations, tiny_ppo

from verl_vllm_rm.dev.ppo_report import read_dump, read_metrics
from verl_vllm_rm.dev.server_launcher import running_server
from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tiny_rm

pytestmark = [pytest.mark.server, pytest.mark.ray]
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
PENALTY = 0.5


@pytest.fixture(scope="module")
def second_rm_server(tmp_path_factory, tiny_rm):
    """Another RM on the session RM's tokenizer (other weights, 10x the head scale), for this module only."""
    path = build_tiny_rm(tmp_path_factory.mktemp("second_rm"), TinyRMSpec(init_seed=7, head_std=1.0))
    with running_server(path, SERVER_ARGS) as server:
        yield server


@pytest.fixture(scope="module")
def two_rm_run(tmp_path_factory, tiny_rm, tiny_task, rm_server, second_rm_server) -> dict:
    overrides = [
        f"+reward.reward_kwargs.reward_models=[{{name:helpful}},{{name:safety,server_url:'{second_rm_server.url}',"
        "whiten:running}]",
        f"+reward.reward_kwargs.routes=[{{data_source:'*',ensemble:mean_minus_std,uncertainty_penalty:{PENALTY}}}]",
    ]
    return tiny_ppo(tmp_path_factory.mktemp("ppo_two_rms"), tiny_rm, tiny_task["policy"], rm_server.url, steps=2,
                    validate=False, extra_overrides=[*overrides, "trainer.save_freq=2"])


def test_every_reward_is_the_ensemble_of_both_servers(two_rm_run, rm_server, second_rm_server):
    from transformers import AutoTokenizer

    work = Path(two_rm_run["rollout_data_dir"]).parent
    tokenizer = AutoTokenizer.from_pretrained(two_rm_run["policy"])
    gens = generations(work)
    checked = 0
    for step in (1, 2):
        dump = read_dump(work, step)
        assert len(dump) == 16
        helpful = expected_totals(dump, gens, tokenizer, rm_server.url)
        safety = expected_totals(dump, gens, tokenizer, second_rm_server.url)
        for (row, a_candidates, rules), (_, b_candidates, _) in zip(helpful, safety):
            a, b = row["rm_score_helpful"], row["rm_score_safety"]
            assert min(abs(a - c) for c in a_candidates) <= 1e-4 and min(abs(b - c) for c in b_candidates) <= 1e-4
            b = row["rm_scaled_safety"]  # safety is whitened before the ensemble (the raw score is kept above)
            ensemble = (a + b) / 2 - PENALTY * abs(a - b) / 2  # population std of two: |a - b| / 2
            assert row["rm_score"] == pytest.approx(ensemble, abs=1e-5)
            assert row["rm_ensemble_std"] == pytest.approx(abs(a - b) / 2, abs=1e-5)
            assert row["score"] == pytest.approx(row["rm_score"] + rules, abs=1e-4)
            checked += 1
    assert checked == 32


def test_per_rm_metrics_are_in_verls_logger(two_rm_run):
    work = Path(two_rm_run["rollout_data_dir"]).parent
    metrics = dict(read_metrics(work))
    for step in (1, 2):
        dump = read_dump(work, step)
        for name in ("rm_score_helpful", "rm_score_safety", "rm_ensemble_std"):
            assert metrics[step][f"reward/{name}/mean"] == pytest.approx(np.mean([r[name] for r in dump]))
        assert metrics[step]["reward/rm_valid_helpful/mean"] == 1.0 == metrics[step]["reward/rm_valid_safety/mean"]


def test_the_checkpoint_holds_the_whitened_rms_statistics(two_rm_run):
    """Trainer mode vllm_rm saves global_step_N/vllm_rm/whitening.json: the whitened RM's running statistics over
    every raw score of the run, merged over the reward-loop workers (the unwhitened RM has none)."""
    work = Path(two_rm_run["rollout_data_dir"]).parent
    saved = json.loads((work / "checkpoints" / "global_step_2" / "vllm_rm" / "whitening.json").read_text())
    seen = np.array([row["rm_score_safety"] for step in (1, 2) for row in read_dump(work, step)], dtype=float)
    assert list(saved["reward_models"]) == ["safety"]
    state = saved["reward_models"]["safety"]
    assert state["count"] == len(seen) == 32 and state["mean"] == pytest.approx(seen.mean(), abs=1e-6)
    assert state["m2"] == pytest.approx(((seen - seen.mean()) ** 2).sum(), rel=1e-6)
