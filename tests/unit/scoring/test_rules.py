"""The rule scorer (``scoring/rules.py``): each composition's rule components over all of its rows at once, a column
for every row (None where its route's composition has no such component), and a failed rm-gallery reward as each of
its rows' own error (raised at once in verl's batch call). Real compositions on the tiny RM's tokenizer, no server."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from verl_vllm_rm.extra_info import RESPONSE_TOKENS
from verl_vllm_rm.rewards import GalleryRewardError
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.options import parse_options
from verl_vllm_rm.scoring.routing import Router
from verl_vllm_rm.scoring.rules import RuleScorer
from verl_vllm_rm.scoring.scorer import Batch


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def router_of(routes: list[dict], tokenizer) -> Router:
    """Routes without reward models (rules only)."""
    options = parse_options({"routes": [{"reward_models": [], **route} for route in routes]})
    return Router(options, tokenizer, {})


def batch_of(router: Router, tokenizer, rows: list[tuple[str, str]], *, batch_call: bool = False) -> Batch:
    """(data_source, response text) per row."""
    samples = [Sample(np.array(tokenizer.encode("Q?", add_special_tokens=False)),
                      np.array(tokenizer.encode(text, add_special_tokens=False)), {"data_source": source})
               for source, text in rows]
    return Batch(samples, [router.route(source) for source, _ in rows], [text for _, text in rows], batch_call)


def test_each_row_gets_its_compositions_components_and_none_of_the_others(tokenizer):
    router = router_of([{"data_source": ["fmt"], "rewards": {"components": ["format", "length"],
                                                             "length": {"max_tokens": 2, "penalty_per_token": 1.0}}},
                        {"data_source": ["*"], "rewards": {"components": ["ngram"],
                                                           "ngram": {"ngram_size": 1, "min_scaling": 0.0}}}],
                       tokenizer)
    scorer = RuleScorer(router.compositions, tokenizer, "ground_truth")
    assert scorer.columns == ("format", "length", RESPONSE_TOKENS, "ngram")
    assert scorer.components == ("format", "length", "ngram")  # the raw lengths are columns, not components
    good = "<think>a</think><answer>b</answer>"
    rows = [("fmt", good), ("other", "aaaa"), ("fmt", "no tags")]
    batch = batch_of(router, tokenizer, rows)
    lengths = [len(tokenizer.encode(text, add_special_tokens=False)) for _, text in rows]
    scores = run(scorer.score(batch))
    assert scores.columns["format"] == [1.0, None, 0.0]
    assert scores.columns[RESPONSE_TOKENS] == [float(lengths[0]), None, float(lengths[2])]
    assert scores.columns["length"] == [-(lengths[0] - 2.0), None, -(lengths[2] - 2.0)]
    np.testing.assert_array_equal(scores.components["format"], [1.0, np.nan, 0.0])
    assert np.isnan(scores.components["ngram"][[0, 2]]).all()
    ids = tokenizer.encode("aaaa", add_special_tokens=False)
    repeat = (len(ids) - len(set(ids))) / (len(ids) - 1)  # unigrams: windows repeating an earlier one
    assert scores.columns["ngram"][1] == pytest.approx(-repeat)
    assert scores.errors == [None] * 3 and not scores.masked.any()


def test_a_composition_without_rules_is_left_to_the_other_scorers(tokenizer):
    router = router_of([{"data_source": ["*"], "rewards": {"components": ["verifiable"]}}], tokenizer)
    scorer = RuleScorer(router.compositions, tokenizer, "ground_truth")
    assert (scorer.compositions, scorer.columns, scorer.components) == ([], (), ())
    scores = run(scorer.score(batch_of(router, tokenizer, [("x", "text")])))
    assert scores.columns == {} and scores.errors == [None]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failed_gallery_reward_is_the_error_of_each_of_its_rows_and_stops_the_batch_call(tokenizer):
    judge = {"llm": {"model": "judge", "base_url": f"http://127.0.0.1:{closed_port()}/v1", "openai_api_key": "k",
                     "max_retries": 0}, "max_retries": 1}
    router = router_of([{"data_source": ["judged"], "rewards": {"components": ["gallery:base_helpfulness_pointwise"],
                                                                "gallery": {"base_helpfulness_pointwise": judge}}},
                        {"data_source": ["*"], "rewards": {"components": ["format"]}}], tokenizer)
    scorer = RuleScorer(router.compositions, tokenizer, "ground_truth")
    rows = [("judged", "Hello."), ("plain", "<think>a</think><answer>b</answer>"), ("judged", "Hi.")]
    scores = run(scorer.score(batch_of(router, tokenizer, rows)))
    assert [type(e) for e in scores.errors] == [GalleryRewardError, type(None), GalleryRewardError]
    assert "gave no score for response 0" in str(scores.errors[0])
    assert scores.columns["format"] == [None, 1.0, None]  # the other composition's rows are scored
    with pytest.raises(GalleryRewardError, match=r"'gallery:base_helpfulness_pointwise' gave no score"):
        run(scorer.score(batch_of(router, tokenizer, rows, batch_call=True)))
