"""The reward-model scorer's own parts that need no server (``scoring/rm_scorer.py``): the RM columns a run writes
(per member, per attribute) and names that would run into each other refused, and each member's input for a row,
a refused one kept as that member's answer under ``failure_policy=mask``. (The scorer asking real servers:
tests/integration/scoring/; through verl's loader with no server: tests/unit/scoring/test_manager.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from verl_vllm_rm.client.length import OverlongInputError
from verl_vllm_rm.extra_info import RM_KEYS
from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.options import parse_options
from verl_vllm_rm.scoring.reward_model import RewardModel
from verl_vllm_rm.scoring.rm_scorer import failed, member_inputs, rm_columns


def models(*entries: dict) -> dict[str, RewardModel]:
    options = parse_options({"server_url": "http://127.0.0.1:1", "reward_models": list(entries)})
    return {o.name: RewardModel(o, None, coalesce_s=0.0) for o in options.rm_options}


def test_one_rm_writes_the_ensembles_columns_only():
    assert rm_columns(models({"name": "rm"}), False, ()) == RM_KEYS


def test_members_attributes_and_per_attribute_ensembles_get_columns_of_their_own():
    rms = models({"name": "a", "whiten": "running"}, {"name": "b", "attributes": {"y": 1.0, "x": -0.5}},
                 {"name": "c", "attributes": {"x": 1.0}, "whiten": "running"})
    assert rm_columns(rms, True, ["x"]) == (
        *RM_KEYS,
        "rm_attr_b_x", "rm_attr_b_y",  # raw attributes, by name
        "rm_attr_c_x", "rm_attr_scaled_c_x",  # and whitened ones
        "rm_ensemble_attr_x", "rm_ensemble_std_x",
        "rm_ensemble_std",
        "rm_score_a", "rm_valid_a", "rm_weight_version_a", "rm_scaled_a",
        "rm_score_b", "rm_valid_b", "rm_weight_version_b",
        "rm_score_c", "rm_valid_c", "rm_weight_version_c", "rm_scaled_c",
    )


def test_rm_and_attribute_names_that_join_into_one_key_are_refused():
    rms = models({"name": "a_b", "attributes": {"c": 1.0}}, {"name": "a", "attributes": {"b_c": 1.0}})
    with pytest.raises(ConfigError, match=r"the reward_extra_info keys \['rm_attr_a_b_c'\] would each hold two values: "
                                          r"reward model and attribute names are joined with '_'.*rename a reward "
                                          r"model \(reward_models\[\]\.name\)"):
        rm_columns(rms, False, ())


SAMPLE = Sample(np.array([1, 2, 3]), np.array([4, 5]), {"uid": "u1"})


def test_each_member_gets_its_input_fitted_to_its_own_max_length():
    rms = models({"name": "long", "max_length": 8}, {"name": "short", "max_length": 4})
    inputs, refused = member_inputs(SAMPLE, list(rms.values()))
    assert refused is None
    assert [i.token_ids.tolist() for i in inputs] == [[1, 2, 3, 4, 5], [2, 3, 4, 5]]  # the prompt cut on the left
    assert [(i.prompt_tokens_dropped, i.prompt_len, i.group_key) for i in inputs] == [(0, 3, ("uid", "u1")),
                                                                                      (1, 2, ("uid", "u1"))]


def test_a_refused_input_raises_or_under_mask_becomes_that_members_answer():
    masked = models({"name": "fits", "max_length": 8},
                    {"name": "strict", "max_length": 4, "overlong_policy": "error", "failure_policy": "mask"})
    inputs, refused = member_inputs(SAMPLE, list(masked.values()))
    assert refused[0] is None and isinstance(refused[1], OverlongInputError)
    assert inputs[0].token_ids.tolist() == [1, 2, 3, 4, 5] and inputs[1].token_ids.size == 0  # a place kept
    raising = models({"name": "fits", "max_length": 8}, {"name": "strict", "max_length": 4, "overlong_policy": "error"})
    with pytest.raises(OverlongInputError, match=r"prompt \(3\) \+ response \(2\) tokens exceed the reward model's max "
                                                 r"length 4"):
        member_inputs(SAMPLE, list(raising.values()))


def test_a_refused_members_answer_is_a_future_already_failed_with_its_error():
    async def answer():
        future = failed(OverlongInputError("too long"))
        assert future.done()
        return await future

    with pytest.raises(OverlongInputError, match="too long"):
        asyncio.new_event_loop().run_until_complete(answer())
