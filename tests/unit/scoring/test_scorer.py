"""What a scorer gives the pipeline (``scoring/scorer.py``): a batch's rows, empty scores (every column None, every
component NaN, nothing masked), a row's own error (raised at once in verl's batch call), and one call per row run
concurrently with each failure kept to its row."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.scorer import Batch, Scores


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def sample(uid: str) -> Sample:
    return Sample(np.array([1, 2]), np.array([3]), {"uid": uid})


def test_a_batch_is_as_long_as_its_rows():
    batch = Batch([sample("a"), sample("b")], [None, None], ["x", ""], batch_call=False)
    assert len(batch) == 2 and not batch.batch_call


def test_empty_scores_have_no_value_for_any_row():
    scores = Scores.empty(3, ("rm_score", "rm_valid"), ("rubric",))
    assert scores.columns == {"rm_score": [None] * 3, "rm_valid": [None] * 3}
    assert list(scores.components) == ["rubric"] and np.isnan(scores.components["rubric"]).all()
    assert scores.masked.tolist() == [False] * 3 and scores.errors == [None] * 3 and scores.token_steps == {}
    scores.columns["rm_score"][0] = 1.0
    assert scores.columns["rm_valid"][0] is None  # each column its own list


def test_a_rows_error_is_its_own_and_in_the_batch_call_raised_at_once():
    scores = Scores.empty(2, ())
    error = ValueError("row 1 cannot be scored")
    scores.fail(1, error, stop=False)
    assert scores.errors == [None, error]
    with pytest.raises(ValueError, match="row 0 too"):
        scores.fail(0, ValueError("row 0 too"), stop=True)
    assert isinstance(scores.errors[0], ValueError)  # recorded before it is raised


async def answer(value, error: BaseException | None = None):
    if error is not None:
        raise error
    return value


def test_each_row_gets_its_calls_answer_and_a_failed_call_fails_its_row_only():
    scores = Scores.empty(4, ())
    calls = [answer("a"), answer(None, KeyError("no such key")), answer("c")]
    answered = run(scores.gather_rows([0, 2, 3], calls, stop=False))
    assert answered == [(0, "a"), (3, "c")]
    assert scores.errors[:2] == [None, None] and scores.errors[3] is None
    assert isinstance(scores.errors[2], KeyError)


def test_in_the_batch_call_a_failed_call_raises():
    scores = Scores.empty(2, ())
    with pytest.raises(RuntimeError, match="server down"):
        run(scores.gather_rows([0, 1], [answer(1), answer(None, RuntimeError("server down"))], stop=True))


def test_a_cancelled_call_stops_the_run_instead_of_failing_a_row():
    scores = Scores.empty(2, ())
    with pytest.raises(asyncio.CancelledError):
        run(scores.gather_rows([0, 1], [answer(1), answer(None, asyncio.CancelledError())], stop=False))
    assert scores.errors == [None, None]
