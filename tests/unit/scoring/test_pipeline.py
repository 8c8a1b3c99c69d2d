"""The one scoring path (``scoring/pipeline.py``) with real routes and the real rule scorer, no server: every row's
reward composed by its own route, its ``reward_extra_info`` with every column, a row that cannot be read or routed
getting its own error while the others are scored, and verl's batch call raising the first error instead."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from verl_vllm_rm.extra_info import SCORE
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.examiner import Examiner
from verl_vllm_rm.scoring.options import parse_options
from verl_vllm_rm.scoring.pipeline import ScoringPipeline
from verl_vllm_rm.scoring.routing import Router, UnroutedDataSourceError
from verl_vllm_rm.scoring.rules import RuleScorer

GOOD = "<think>a</think><answer>b</answer>"


@pytest.fixture()
def pipeline(tokenizer):
    options = parse_options({"routes": [
        {"data_source": ["fmt"], "reward_models": [],
         "rewards": {"components": ["format"], "weights": {"format": 2.0}}},
        {"data_source": ["rep/*"], "reward_models": [],
         "rewards": {"components": ["format", "ngram"], "ngram": {"ngram_size": 1, "min_scaling": 0.0}}},
    ]})
    router = Router(options, tokenizer, {})
    return ScoringPipeline(router, [RuleScorer(router.compositions, tokenizer, "ground_truth")], tokenizer,
                           Examiner(tokenizer, num_examine=0))


def sample(tokenizer, source: str, text: str) -> Sample:
    return Sample(np.array(tokenizer.encode("Q?", add_special_tokens=False)),
                  np.array(tokenizer.encode(text, add_special_tokens=False)), {"data_source": source})


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def test_each_row_is_composed_by_its_route_and_carries_every_column(pipeline, tokenizer):
    assert pipeline.columns == (SCORE, "format", "ngram") and not pipeline.token_level
    results = run(pipeline.score([sample(tokenizer, "fmt", GOOD), sample(tokenizer, "rep/a", "aaaa"),
                                  sample(tokenizer, "fmt", "no tags")], batch_call=False))
    assert [r["reward_score"] for r in results] == [2.0, 0.05 * 0.0 + 1.0 * -1.0, 0.0]  # format 2.0; 0.05 f + ngram
    assert results[0]["reward_extra_info"] == {SCORE: 2.0, "format": 1.0, "ngram": None}
    assert results[1]["reward_extra_info"] == {SCORE: -1.0, "format": 0.0, "ngram": -1.0}
    assert pipeline.failed == 0


def test_a_row_that_cannot_be_read_or_routed_gets_its_own_error_and_the_others_are_scored(pipeline, tokenizer):
    unread = ValueError("rows of different widths cannot be read together")
    results = run(pipeline.score([sample(tokenizer, "fmt", GOOD), unread, sample(tokenizer, "chat", GOOD),
                                  sample(tokenizer, "rep/b", "aaaa")], batch_call=False))
    assert results[0]["reward_score"] == 2.0 and results[3]["reward_score"] == -1.0
    assert results[1] is unread
    assert isinstance(results[2], UnroutedDataSourceError) and "data_source 'chat' matches no route" in str(results[2])


def test_the_batch_call_raises_the_first_rows_error(pipeline, tokenizer):
    with pytest.raises(UnroutedDataSourceError, match=r"^data_source 'chat' matches no route of reward_kwargs\.routes"):
        run(pipeline.score([sample(tokenizer, "fmt", GOOD), sample(tokenizer, "chat", GOOD)], batch_call=True))
    with pytest.raises(ValueError, match="^cannot be read$"):
        run(pipeline.score([ValueError("cannot be read"), sample(tokenizer, "fmt", GOOD)], batch_call=True))
    results = run(pipeline.score([sample(tokenizer, "fmt", GOOD)], batch_call=True))
    assert results == [{"reward_score": 2.0, "reward_extra_info": {SCORE: 2.0, "format": 1.0, "ngram": None}}]

