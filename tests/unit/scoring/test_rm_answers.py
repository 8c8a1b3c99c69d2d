"""The reward models' part of one sample's reward (``scoring/rm_answers.py``), over answers given directly (no
server): each member's answer under its failure policy, the ensemble and its bookkeeping in ``reward_extra_info``
(per member when the run has several RMs), and the reference answer's score beside the sample's. Attribute RMs'
columns: test_attribute_ensemble.py; a sample and its reference asked again on one weight version:
tests/integration/scoring/test_reference_versions.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from verl_vllm_rm.client.reward_client import RewardServerError
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.options import parse_options
from verl_vllm_rm.scoring.reward_model import RewardModel, Scored
from verl_vllm_rm.scoring.rm_answers import member_answer, reference_score, rm_info
from verl_vllm_rm.scoring.rm_inputs import RMInput
from verl_vllm_rm.scoring.routing import Router

INPUT = RMInput(np.arange(5), ("uid", "u1"), 2, 3)


def route_of(*entries: dict, **route):
    options = parse_options({"server_url": "http://127.0.0.1:1", "reward_models": list(entries),
                             "routes": [{"data_source": ["*"], **route}]})
    router = Router(options, None, {o.name: RewardModel(o, None, coalesce_s=0.0) for o in options.rm_options})
    return router.routes[0]


def scored(score: float, version: int = 3, done: float = 10.0, failovers: int = 0) -> Scored:
    return Scored(score, version, done, failovers=failovers)


def test_an_answer_is_the_members_score_and_raw_reward():
    (rm,) = route_of({"name": "a"}).members
    answer = scored(0.5)
    assert member_answer(rm, answer, INPUT, ensemble=False) == (answer, 0.5)


def test_a_failed_member_raises_or_under_mask_is_left_out_and_counted():
    strict, lenient = route_of({"name": "strict"}, {"name": "lenient", "failure_policy": "mask"}).members
    error = RewardServerError("reward server http://127.0.0.1:1 refused the request")
    with pytest.raises(RewardServerError, match=r"^reward server http://127\.0\.0\.1:1 refused"):
        member_answer(strict, error, INPUT, ensemble=False)  # the error as it came
    with pytest.raises(RewardServerError, match=r"^reward model 'strict' failed \(its failure_policy is raise; "
                                                r"failure_policy=mask drops it from the ensemble instead\): reward "
                                                r"server http://127\.0\.0\.1:1 refused"):
        member_answer(strict, error, INPUT, ensemble=True)
    assert member_answer(lenient, error, INPUT, ensemble=True) is None and lenient.failed == 1
    assert member_answer(lenient, scored(None), INPUT, ensemble=True) is None  # no outcome score: a failure too
    assert lenient.failed == 2 and strict.failed == 0


def test_the_ensemble_and_its_bookkeeping_come_from_the_members_that_answered():
    route = route_of({"name": "a"}, {"name": "b", "failure_policy": "mask"}, {"name": "c"}, ensemble="min")
    a, b, c = route.members
    answers = [(scored(1.0, version=5, done=10.5, failovers=1), 1.0), None, (scored(3.0, version=4, done=10.25), 3.0)]
    info = rm_info(route, route.members, [INPUT] * 3, answers, 10.0, learn=True, per_member=True)
    assert info == {
        "rm_prompt_tokens_dropped": 6.0, "rm_tokens": 15.0,  # over the three inputs
        "rm_score": 1.0, "rm_valid": 1.0, "rm_latency_ms": 500.0,  # the last answer came 0.5 s after the requests
        "rm_weight_version": 4.0, "rm_failovers": 1.0,  # the oldest version, the most fail-overs
        "rm_ensemble_std": 1.0,
        "rm_score_a": 1.0, "rm_valid_a": 1.0, "rm_weight_version_a": 5.0,
        "rm_score_b": None, "rm_valid_b": 0.0, "rm_weight_version_b": None,
        "rm_score_c": 3.0, "rm_valid_c": 1.0, "rm_weight_version_c": 4.0,
    }


def test_a_sample_every_member_failed_on_is_masked_and_a_route_without_rms_asks_nothing():
    route = route_of({"name": "a", "failure_policy": "mask"})
    info = rm_info(route, route.members, [INPUT], [None], 0.0, learn=True, per_member=False)
    assert (info["rm_score"], info["rm_valid"], info["rm_weight_version"], info["rm_failovers"]) == (0.0, 0.0, -1.0,
                                                                                                     0.0)
    assert info["rm_latency_ms"] > 0 and "rm_score_a" not in info
    rules_only = route_of({"name": "a"}, reward_models=[], rewards={"components": ["format"]})
    assert rm_info(rules_only, [], [], [], 0.0, learn=True, per_member=False) == {
        "rm_prompt_tokens_dropped": 0.0, "rm_tokens": 0.0}


def test_only_a_training_sample_moves_a_whitened_members_scale():
    route = route_of({"name": "a", "whiten": "running"})
    (rm,) = route.members
    for x, learn in ((1.0, True), (3.0, True), (100.0, False)):
        info = rm_info(route, route.members, [INPUT], [(scored(x), x)], 0.0, learn=learn, per_member=True)
    assert rm.whitening.count == 2  # validation was scored on the training scale without moving it
    assert info["rm_scaled_a"] == info["rm_score"] == (100.0 - 2.0) / 1.0 and info["rm_score_a"] == 100.0


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


SAMPLE = Sample(np.array([1, 2]), np.array([3]), {"uid": "u1"})


def test_the_references_score_is_the_routes_ensemble_of_the_members_reference_answers():
    route = route_of({"name": "a"}, {"name": "b"})
    answers = [(scored(1.0), 1.0), (scored(2.0), 2.0)]
    references = [(scored(0.5), 0.5), (scored(1.5), 1.5)]  # on the samples' version: nothing asked again
    got, reference = run(reference_score(SAMPLE, "4", route, route.members, [INPUT] * 2, answers, references))
    assert got == answers and reference == 1.0


def test_a_member_failing_on_the_reference_raises_or_under_mask_leaves_no_reference_score():
    route = route_of({"name": "a", "failure_policy": "mask"}, {"name": "b"})
    answers = [(scored(1.0), 1.0), (scored(2.0), 2.0)]
    error = RewardServerError("reward server down")
    got, reference = run(reference_score(SAMPLE, "4", route, route.members, [INPUT] * 2, answers,
                                         [error, (scored(1.5), 1.5)]))
    assert got == answers and reference is None  # the ensemble without a member would be another reward
    strict = route_of({"name": "a"}, {"name": "b"})
    with pytest.raises(RewardServerError, match="^reward server down$"):
        run(reference_score(SAMPLE, "4", strict, strict.members, [INPUT] * 2, answers, [error, (scored(1.5), 1.5)]))
    masked_sample = [None, (scored(2.0), 2.0)]  # a member masked on the sample has no score to pair
    got, reference = run(reference_score(SAMPLE, "4", route, route.members, [INPUT] * 2, masked_sample,
                                         [(scored(0.5), 0.5), (scored(1.5), 1.5)]))
    assert got == masked_sample and reference == 1.0
