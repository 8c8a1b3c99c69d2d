"""A generative judge in verl's real ``main_ppo`` (GRPO on CPU through the harness): every reward is tiny-ppo's
composition plus half the listwise judge's score of the response within its group, judged once per group across
verl's two reward-loop workers; validation groups hold ``val_kwargs.n`` = 2 responses, which only works because
trainer mode ``vllm_rm`` tells the workers when verl validates (verl's per-trajectory reward calls do not say;
a validation group would otherwise wait for 4 members until ``group_timeout_s`` and fail the run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ppo_runs import tiny_ppo

from verl_vllm_rm.dev.ppo_report import read_dump
from verl_vllm_rm.dev.tiny_ppo import FORM_WEIGHT

pytestmark = [pytest.mark.server, pytest.mark.ray]
GROUP = 4  # tiny-ppo's responses per prompt in training
JUDGE_WEIGHT = 0.5


@pytest.fixture(scope="module")
def judge_run(tmp_path_factory, tiny_rm, tiny_task, rm_server, judge_server) -> dict:
    overrides = [
        "++reward.reward_kwargs.rewards.components=[rubric,verifiable,format,judge]",  # tiny-ppo's, plus the judge
        f"++reward.reward_kwargs.rewards.weights.judge={JUDGE_WEIGHT}",
        f"+reward.reward_kwargs.judge={{server_url:'{judge_server.url}',mode:listwise,group_timeout_s:120}}",
        "actor_rollout_ref.rollout.val_kwargs.n=2", "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
    ]
    return tiny_ppo(tmp_path_factory.mktemp("ppo_judge"), tiny_rm, tiny_task["policy"], rm_server.url, steps=2,
                    extra_overrides=overrides)


def test_every_training_reward_holds_the_groups_one_listwise_judgement(judge_run):
    work = Path(judge_run["rollout_data_dir"]).parent
    for step in (1, 2):
        dump = read_dump(work, step)
        groups: dict[str, list[dict]] = {}
        for row in dump:
            groups.setdefault(row["group"], []).append(row)
        assert len(dump) == 16 and all(len(g) == GROUP for g in groups.values())
        for members in groups.values():
            assert sorted(m["judge_rank"] for m in members) == [0.0, 1.0, 2.0, 3.0]  # one ranking per group
            for m in members:
                assert m["judge_valid"] == 1.0 and m["rm_valid"] == 1.0
                assert m["judge_score"] == pytest.approx(1 - 2 * m["judge_rank"] / (GROUP - 1))
                rules = m["verifiable_score"] + FORM_WEIGHT * m["format"]
                assert m["score"] == pytest.approx(m["rm_score"] + rules + JUDGE_WEIGHT * m["judge_score"], abs=1e-5)


def test_validation_groups_of_val_kwargs_n_are_judged(judge_run):
    validation = judge_run["validation"]
    assert set(validation) == {0, 2}
    for figures in validation.values():
        valid = [v for k, v in figures.items() if k.endswith("/judge_valid/mean@2")]
        ranks = [v for k, v in figures.items() if k.endswith("/judge_rank/mean@2")]
        assert valid == [1.0] and ranks == [0.5], sorted(figures)  # groups of two: ranks 0 and 1
