"""Attribute RMs whitened per attribute and ensembled per attribute, against the rules written out with numpy.

Pure: the manager is loaded through verl (no server behind its URL); its RMs are told the served head
(``check_head``, as the health probe does) and given answers directly, so ``rm_info`` sees what it sees in a run.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape
from verl_vllm_rm.scoring.reward_model import Scored
from verl_vllm_rm.scoring.rm_answers import member_answer, reference_score, rm_info
from verl_vllm_rm.scoring.rm_inputs import RMInput

LABELS = ("helpfulness", "correctness", "coherence", "complexity", "verbosity")
WEIGHTS = {"verbosity": -0.5, "helpfulness": 1.0, "coherence": 0.25}  # not in label or name order on purpose
NAMES = sorted(WEIGHTS)
W = np.array([WEIGHTS[a] for a in NAMES])
SCALES = np.array([3.0, 0.5, 1.0, 2.0, 10.0])  # each attribute on its own scale
SHAPE = ModelShape(HeadKind.ATTRIBUTES, "LlamaForSequenceClassification", LABELS, "float32", "float32")
COLUMNS = [LABELS.index(a) for a in NAMES]


def manager_of(load_manager, verl_config, tokenizer, **kwargs):
    mgr = load_manager(verl_config("http://127.0.0.1:1", **kwargs), tokenizer)
    for rm in mgr.reward_models.values():
        if rm.options.attributes is not None:
            rm.check_head(SHAPE)
    return mgr


def heads(n: int, seed: int) -> np.ndarray:
    """``n`` answers of the attribute head, each attribute with its own mean and spread."""
    rng = np.random.default_rng(seed)
    return rng.normal(np.arange(5.0), SCALES, size=(n, 5))


def info_of(mgr, outcomes, *, learn: bool = True) -> dict:
    """``reward_extra_info``'s RM part for one sample whose members answered ``outcomes`` (a head row, a scalar
    score, or an exception)."""
    route = mgr.router.routes[0]
    inputs = [RMInput(np.arange(4), ("g", 0), 0, 2) for _ in route.members]
    answers = []
    for rm, outcome, rm_input in zip(route.members, outcomes, inputs):
        if not isinstance(outcome, BaseException):
            row = outcome if np.ndim(outcome) else None
            outcome = Scored(None if row is not None else float(outcome), 0, time.perf_counter(),
                             attributes=None if row is None else [float(x) for x in row])
        answers.append(member_answer(rm, outcome, rm_input, ensemble=len(route.members) > 1))
    info = rm_info(route, route.members, inputs, answers, time.perf_counter(), learn=learn,
                   per_member=mgr.rm_scorer.per_member)
    assert set(info) <= set(mgr.pipeline.columns)  # every key a sample gets is one of verl's columns
    return info


def whitened_by_hand(rows: np.ndarray) -> np.ndarray:
    """Each row's attributes whitened on the statistics of every row up to it (itself included): Welford's
    rule written out, std 1 until two rows."""
    out = np.zeros_like(rows)
    for i in range(len(rows)):
        seen = rows[: i + 1]
        std = seen.std(axis=0) if i >= 1 else np.ones(rows.shape[1])
        out[i] = (rows[i] - seen.mean(axis=0)) / std
    return out


def test_each_attribute_is_whitened_on_its_own_statistics_before_the_weights_apply(load_manager, verl_config,
                                                                                     tokenizer):
    mgr = manager_of(load_manager, verl_config, tokenizer, attributes=WEIGHTS, whiten="running")
    rm = mgr.rm
    assert rm.whitening is None and sorted(rm.whitenings) == [f"rm/{a}" for a in NAMES]
    rows = heads(40, seed=0)
    infos = [info_of(mgr, [row]) for row in rows]
    raw = rows[:, COLUMNS]
    scaled = whitened_by_hand(raw)
    for j, attribute in enumerate(NAMES):
        assert np.allclose([i[f"rm_attr_rm_{attribute}"] for i in infos], raw[:, j])  # raw values kept
        assert np.allclose([i[f"rm_attr_scaled_rm_{attribute}"] for i in infos], scaled[:, j])
    assert np.allclose([i["rm_score"] for i in infos], scaled @ W)
    assert np.allclose([i["rm_scaled_rm"] for i in infos], scaled @ W)
    assert np.allclose([i["rm_score_rm"] for i in infos], raw @ W)  # the raw weighted sum
    assert "rm_attr_scaled_rm_correctness" not in mgr.pipeline.columns  # unweighted: neither read nor whitened

    # validation: whitened on the statistics as they are, which it leaves alone
    counts = {key: w.count for key, w in rm.whitenings.items()}
    probe = heads(1, seed=1)[0]
    validation = info_of(mgr, [probe], learn=False)
    assert {key: w.count for key, w in rm.whitenings.items()} == counts
    expected = (probe[COLUMNS] - raw.mean(axis=0)) / raw.std(axis=0)
    assert validation["rm_score"] == pytest.approx(float(expected @ W))


def two_attribute_rms(**b_options) -> list[dict]:
    return [{"name": "a", "attributes": WEIGHTS}, {"name": "b", "attributes": WEIGHTS, **b_options}]


@pytest.mark.parametrize("method", ["mean", "min", "median", "mean_minus_std"])
def test_members_with_the_same_attributes_are_ensembled_per_attribute_then_weighted(load_manager, verl_config,
                                                                                    tokenizer, method):
    reordered = {a: WEIGHTS[a] for a in reversed(WEIGHTS)}  # the same attributes, listed in another order
    mgr = manager_of(load_manager, verl_config, tokenizer, reward_models=two_attribute_rms(attributes=reordered),
                     routes=[{"data_source": ["*"], "ensemble": method, "uncertainty_penalty": 0.5}])
    assert mgr.router.routes[0].attributes == {a: WEIGHTS[a] for a in NAMES}
    rows_a, rows_b = heads(8, seed=2), heads(8, seed=3)
    members = np.stack([rows_a[:, COLUMNS], rows_b[:, COLUMNS]], axis=2)  # [sample, attribute, member]
    by_hand = {"mean": members.mean(axis=2), "min": members.min(axis=2), "median": np.median(members, axis=2),
               "mean_minus_std": members.mean(axis=2) - 0.5 * members.std(axis=2)}[method]
    infos = [info_of(mgr, [a, b]) for a, b in zip(rows_a, rows_b)]
    assert np.allclose([i["rm_score"] for i in infos], by_hand @ W)
    for j, attribute in enumerate(NAMES):
        assert np.allclose([i[f"rm_ensemble_attr_{attribute}"] for i in infos], by_hand[:, j])
        assert np.allclose([i[f"rm_ensemble_std_{attribute}"] for i in infos], members[:, j].std(axis=1))
    sums = np.einsum("sam,a->sm", members, W)
    assert np.allclose([i["rm_ensemble_std"] for i in infos], sums.std(axis=1))  # of the members' rewards
    if method == "mean_minus_std":  # each attribute's disagreement is penalised, not only the sums'
        assert not np.allclose(by_hand @ W, sums.mean(axis=1) - 0.5 * sums.std(axis=1))


def test_a_masked_member_leaves_the_others_attributes(load_manager, verl_config, tokenizer):
    rms = [{**rm, "failure_policy": "mask"} for rm in two_attribute_rms()]
    mgr = manager_of(load_manager, verl_config, tokenizer, reward_models=rms,
                     routes=[{"data_source": ["*"], "ensemble": "mean_minus_std"}])
    row = heads(1, seed=4)[0]
    info = info_of(mgr, [ConnectionError("down"), row])
    assert info["rm_valid_a"] == 0.0 and info["rm_score"] == pytest.approx(float(row[COLUMNS] @ W))
    assert info["rm_ensemble_std_verbosity"] == 0.0 and info["rm_attr_a_verbosity"] is None
    nothing = info_of(mgr, [ConnectionError("down"), ConnectionError("down")])
    assert nothing["rm_valid"] == 0.0 and nothing["rm_ensemble_attr_verbosity"] is None


def test_whitened_members_are_ensembled_on_their_whitened_attributes(load_manager, verl_config, tokenizer):
    rms = [{**rm, "whiten": "running"} for rm in two_attribute_rms()]
    mgr = manager_of(load_manager, verl_config, tokenizer, reward_models=rms)
    rows_a, rows_b = heads(12, seed=5), heads(12, seed=6) * 4.0
    infos = [info_of(mgr, [a, b]) for a, b in zip(rows_a, rows_b)]
    scaled = (whitened_by_hand(rows_a[:, COLUMNS]) + whitened_by_hand(rows_b[:, COLUMNS])) / 2
    assert np.allclose([i["rm_score"] for i in infos], scaled @ W)


@pytest.mark.parametrize("members", [
    [{"name": "a", "attributes": WEIGHTS}, {"name": "b", "attributes": {**WEIGHTS, "verbosity": -1.0}}],
    [{"name": "a", "attributes": WEIGHTS}, {"name": "b", "attributes": {"helpfulness": 1.0}}],
    [{"name": "a", "attributes": WEIGHTS}, {"name": "b"}],
], ids=["other-weights", "other-attributes", "a-scalar-rm"])
def test_other_routes_ensemble_the_members_rewards(load_manager, verl_config, tokenizer, members):
    """A route whose members are not attribute RMs with the same attributes ensembles their rewards (an
    attribute RM's is its weighted sum), as a route of scalar RMs does."""
    mgr = manager_of(load_manager, verl_config, tokenizer, reward_models=members,
                     routes=[{"data_source": ["*"], "ensemble": "mean_minus_std"}])
    assert mgr.router.routes[0].attributes is None and mgr.router.ensembled_attributes == []
    row = heads(1, seed=7)[0]
    b = 2.5 if "attributes" not in members[1] else row
    info = info_of(mgr, [row, b])
    a_reward = float(row[COLUMNS] @ W)
    b_reward = 2.5 if "attributes" not in members[1] else sum(
        w * row[LABELS.index(name)] for name, w in members[1]["attributes"].items())
    rewards = np.array([a_reward, b_reward])
    assert info["rm_score"] == pytest.approx(rewards.mean() - rewards.std())
    assert not any(key.startswith("rm_ensemble_attr_") for key in info)


def test_a_reference_answer_is_ensembled_per_attribute_on_the_current_scale(load_manager, verl_config, tokenizer):
    rms = [{**rm, "whiten": "running"} for rm in two_attribute_rms()]
    mgr = manager_of(load_manager, verl_config, tokenizer, reward_models=rms,
                     routes=[{"data_source": ["*"], "ensemble": "min"}])
    for a, b in zip(heads(6, seed=8), heads(6, seed=9)):
        info_of(mgr, [a, b])
    route = mgr.router.routes[0]
    reference = heads(2, seed=10)

    references = [(Scored(None, 0, 0.0, attributes=[float(x) for x in row]), float(row[COLUMNS] @ W))
                  for row in reference]
    answers = [(Scored(None, 0, 0.0, attributes=[0.0] * 5), 0.0)] * 2  # the sample's, on the references' version
    counts = [w.count for rm in route.members for w in rm.attribute_whitenings]
    kept, got = asyncio.run(reference_score(None, "the reference", route, route.members, [None, None], answers,
                                            references))
    assert kept == answers
    scaled = [[w.whiten(x) for w, x in zip(rm.attribute_whitenings, row[COLUMNS])]
              for rm, row in zip(route.members, reference)]
    assert got == pytest.approx(float(np.min(scaled, axis=0) @ W))
    assert [w.count for rm in route.members for w in rm.attribute_whitenings] == counts  # a reference never counts


def test_reward_model_and_attribute_names_that_join_into_one_key_are_refused(load_manager, verl_config, tokenizer):
    """RM ``a_b`` with attribute ``c`` and RM ``a`` with attribute ``b_c`` would both write ``rm_attr_a_b_c``."""
    rms = [{"name": "a_b", "attributes": {"c": 1.0}}, {"name": "a", "attributes": {"b_c": 1.0}}]
    routes = [{"data_source": "x", "reward_models": ["a_b"]}, {"data_source": "*", "reward_models": ["a"]}]
    with pytest.raises(ConfigError) as refused:
        load_manager(verl_config("http://127.0.0.1:1", reward_models=rms, routes=routes), tokenizer)
    assert str(refused.value).startswith(
        "the reward_extra_info keys ['rm_attr_a_b_c'] would each hold two values: reward model and attribute names "
        "are joined with '_'")
    assert str(refused.value).endswith("rename a reward model (reward_models[].name)")
