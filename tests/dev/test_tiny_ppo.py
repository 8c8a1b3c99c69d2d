"""``vllm_rm`` inside verl's real ``main_ppo`` (GRPO on CPU through the harness, the real vLLM server):
the rewards verl trained on are the server's scores of the exact token ids it generated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ppo_runs import expected_totals, generations, tiny_ppo

from verl_vllm_rm.dev.ppo_report import read_dump



@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, tiny_rm, tiny_task, rm_server) -> dict:
    """vllm_rm in main_ppo: 2 GRPO steps against the session server, validation before and after."""
    return tiny_ppo(tmp_path_factory.mktemp("ppo_plain"), tiny_rm, tiny_task["policy"], rm_server.url, steps=2)


@pytest.mark.server
@pytest.mark.ray
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


@pytest.mark.server
@pytest.mark.ray
def test_rewards_verl_trained_on_equal_direct_scores(plain_run, rm_server):
    """Every dumped reward = direct /score of the same token ids + gsm8k correctness + FORM_WEIGHT * form."""
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


@pytest.mark.server
@pytest.mark.ray
def test_validation_reports_pairwise_win_rates(plain_run):
    validation = plain_run["validation"]
    assert set(validation) == {0, 2}
    for figures in validation.values():
        assert {"openai/gsm8k/win/mean@1", "openai/gsm8k/win_and/mean@1"} <= set(figures), sorted(figures)
        win = next(v for k, v in figures.items() if k.endswith("/win/mean@1"))
        win_and = next(v for k, v in figures.items() if k.endswith("/win_and/mean@1"))
        assert 0.0 <= win <= win_and <= 1.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"online": "sometimes"}, "--online must be one of"),
    ({"steps": 0}, "--steps must be >= 1"),
])
def test_bad_options_are_refused(tmp_path, kwargs, message):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig

    with pytest.raises(ValueError, match=message):
        TinyPPOConfig(tmp_path, **kwargs)


def test_an_rm_dir_without_a_model_is_refused_before_anything_starts(tmp_path):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, TinyPPOError, run_tiny_ppo

    with pytest.raises(TinyPPOError, match="no config.json there"):
        run_tiny_ppo(TinyPPOConfig(tmp_path / "work", rm=str(tmp_path)), on_step=None)
    assert not (tmp_path / "work" / "main_ppo.log").exists()


def test_cli_reports_failures_with_exit_code_1(tmp_path):
    import subprocess
    import sys

    cli = Path(sys.executable).parent / "verl-vllm-rm"
    run = subprocess.run([str(cli), "tiny-ppo", "--rm", str(tmp_path), "--work-dir", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "tiny-ppo: --rm" in run.stderr and "no config.json" in run.stderr
