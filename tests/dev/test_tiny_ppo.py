"""``vllm_rm`` inside verl's real ``main_ppo`` (GRPO on CPU through the harness, the real vLLM server):
the rewards verl trained on are the server's scores of the exact token ids it generated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import expected_totals, generations

from verl_vllm_rm.dev.tiny_ppo import read_dump

pytestmark = [pytest.mark.server, pytest.mark.ray]


def test_main_ppo_runs_the_steps_and_writes_the_summary(plain_run):
    steps = plain_run["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["reward_mean"] is not None and s["rm_score_mean"] is not None
        assert s["rm_version"] == 0 and s["parity_max_abs"] is None  # no online RM training
    work = Path(plain_run["rollout_data_dir"]).parent
    assert json.loads((work / "summary.json").read_text())["steps"] == steps
    assert Path(plain_run["plot"]).stat().st_size > 1000
    assert Path(plain_run["rollout_data_dir"], "2.jsonl").is_file()


def test_rewards_verl_trained_on_equal_direct_scores(plain_run, rm_server):
    """Every dumped reward = direct /score of the same token ids + gsm8k correctness + 0.5 * form."""
    from transformers import AutoTokenizer

    work = Path(plain_run["rollout_data_dir"]).parent
    tokenizer = AutoTokenizer.from_pretrained(plain_run["policy"])
    gens = generations(work)
    checked = 0
    for step in (1, 2):
        dump = read_dump(work, step)
        assert len(dump) == 16  # 4 prompts x 4 responses
        for row, rm_candidates, rules in expected_totals(dump, gens, tokenizer, rm_server.url):
            assert row["rm_valid"] == 1.0
            assert min(abs(row["rm_score"] - c) for c in rm_candidates) <= 1e-4, (row, rm_candidates)
            assert abs(row["score"] - (row["rm_score"] + rules)) <= 1e-4, row  # the composed total
            checked += 1
    assert checked == 32


def test_validation_reports_pairwise_win_rates(plain_run):
    validation = plain_run["validation"]
    assert set(validation) == {0, 2} or set(map(int, validation)) == {0, 2}
    for figures in validation.values():
        keys = {k.split("/", 2)[-1] for k in figures}
        assert {"win/mean@1", "win_and/mean@1"} <= keys, sorted(figures)
        win = next(v for k, v in figures.items() if k.endswith("/win/mean@1"))
        win_and = next(v for k, v in figures.items() if k.endswith("/win_and/mean@1"))
        assert 0.0 <= win <= win_and <= 1.0
