"""The manager's judge component (``judge/reward.py``) in-process: group sizes from verl's config, and the groups a
mode refuses (the judge itself: tests/integration/scoring/test_judging.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.judge.reward import group_sizes
from verl_vllm_rm.dev.loader import vllm_rm_config
from verl_vllm_rm.judge.options import JudgeOptions

NO_VALIDATION = ["trainer.val_before_train=False", "trainer.test_freq=-1"]


@pytest.mark.parametrize("overrides, judge, sizes", [
    (["actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.val_kwargs.n=2"], {}, (8, 2)),
    (["actor_rollout_ref.rollout.n=8", *NO_VALIDATION], {}, (8, 1)),  # no validation: its size does not matter
    ([], {"group_size": 4}, (4, 4)),
    ([], {"mode": "pairwise"}, (1, 1)),  # against the reference: a response alone is enough
])
def test_group_sizes_come_from_verls_rollout(tiny_rm, overrides, judge, sizes):
    assert group_sizes(JudgeOptions(**judge), vllm_rm_config("http://127.0.0.1:1", tiny_rm, {}, overrides)) == sizes


@pytest.mark.parametrize("mode", ["listwise", "pointwise", "pairwise_group"])
@pytest.mark.parametrize("overrides, phase", [
    ([], r"training groups hold 1 response\(s\) \(actor_rollout_ref.rollout.n\)"),
    (["actor_rollout_ref.rollout.n=4"], r"validation groups hold 1 response\(s\) \(actor_rollout_ref.rollout.val_kwargs.n\)"),
])
def test_modes_that_compare_within_a_group_refuse_groups_of_one(tokenizer, tiny_rm, mode, overrides, phase):
    from verl_vllm_rm.dev.loader import load_manager

    judge = {"server_url": ["http://127.0.0.1:1"], "mode": mode.split("_")[0]}
    if mode == "pairwise_group":
        judge["pairwise_against"] = "group"
    kwargs = {"rewards": {"components": ["rubric", "judge"]}, "judge": judge}
    with pytest.raises(ConfigError, match=rf"judge mode {judge['mode']} compares each response with the others "
                                          rf"of its group, and {phase}: set it to 2 or more"):
        load_manager(tokenizer, "http://127.0.0.1:1", tiny_rm, kwargs, overrides)


def test_a_run_whose_group_size_is_unknown_is_refused_naming_both_settings(tokenizer, tiny_rm):
    """No ``judge.group_size`` and verl's ``actor_rollout_ref.rollout.n`` set to null: the manager cannot know when
    a group is whole, so it refuses to load rather than judge partial groups."""
    from verl_vllm_rm.dev.loader import load_manager

    kwargs = {"rewards": {"components": ["rubric", "judge"]},
              "judge": {"server_url": ["http://127.0.0.1:1"], "mode": "listwise"}}
    with pytest.raises(ConfigError, match=r"judge needs the prompt groups' size: set reward_kwargs\.judge\.group_size, "
                                          r"or run with verl's actor_rollout_ref\.rollout\.n"):
        load_manager(tokenizer, "http://127.0.0.1:1", tiny_rm, kwargs, ["actor_rollout_ref.rollout.n=null"])


def test_group_sizes_read_a_plain_config_without_the_rest_of_verls():
    """Only ``actor_rollout_ref.rollout`` and whether the run validates matter; a run that never validates needs no
    validation group of 2."""
    rollout = {"n": 4, "val_kwargs": {"n": 3}}
    validating = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "trainer": {"test_freq": 5}})
    assert group_sizes(JudgeOptions(), validating) == (4, 3)
    assert group_sizes(JudgeOptions(), OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 4}}})) == (4, 1)
    assert group_sizes(JudgeOptions(group_size=3), OmegaConf.create({})) == (3, 3)
    one = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 1}}})
    assert group_sizes(JudgeOptions(mode="pairwise"), one) == (1, 1)  # against the reference: groups of one judge
    with pytest.raises(ValueError, match=r"and validation groups hold 1 response\(s\) "
                                         r"\(actor_rollout_ref\.rollout\.val_kwargs\.n\): set it to 2 or more, "
                                         r"or judge mode=pairwise with pairwise_against=reference"):
        group_sizes(JudgeOptions(), OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 4}},
                                                       "trainer": {"val_before_train": True}}))
    with pytest.raises(ValueError, match=r"judge needs the prompt groups' size"):
        group_sizes(JudgeOptions(mode="pointwise"), OmegaConf.create({}))
