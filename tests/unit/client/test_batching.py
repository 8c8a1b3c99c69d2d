"""The group batcher's pure logic: budget split, group order, coalescing, per-chunk failure (no server).

The batcher takes any async ``score_fn``; here it is a recording function (score = number of
tokens), so the tests see exactly which requests the batcher formed. The batcher on the real
server is covered in ``test_manager.py`` and ``test_fault_tolerance.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from verl_vllm_rm.client.batching import GroupBatcher, group_order, split_by_budget


def test_split_by_budget_respects_both_limits():
    assert split_by_budget([3, 3, 3, 3, 3], max_seqs=2, max_tokens=100) == [range(0, 2), range(2, 4), range(4, 5)]
    assert split_by_budget([4, 4, 4, 1], max_seqs=10, max_tokens=8) == [range(0, 2), range(2, 4)]
    assert split_by_budget([], max_seqs=2, max_tokens=8) == []


def test_an_item_over_the_token_budget_gets_a_request_of_its_own():
    assert split_by_budget([2, 50, 2], max_seqs=10, max_tokens=8) == [range(0, 1), range(1, 2), range(2, 3)]


def test_group_order_keeps_groups_adjacent_in_order_of_first_arrival():
    assert group_order(["b", "a", "b", "c", "a"]) == [0, 2, 1, 4, 3]


def run_batcher(submissions, *, max_seqs=64, max_tokens=10_000, fail_when=None):
    """Submit (key, ids) pairs concurrently; returns (results in submission order, requests sent)."""
    requests: list[list[list[int]]] = []

    async def score_fn(items):
        requests.append(items)
        await asyncio.sleep(0)
        if fail_when is not None and fail_when(items):
            raise RuntimeError("server said no")
        return [float(len(ids)) for ids in items]

    async def go():
        batcher = GroupBatcher(score_fn, coalesce_s=0.01, max_seqs=max_seqs, max_tokens=max_tokens)
        return await asyncio.gather(*(batcher.submit(k, ids) for k, ids in submissions), return_exceptions=True)

    return asyncio.run(go()), requests


def test_calls_within_the_window_form_one_grouped_request():
    subs = [("p1", [1]), ("p2", [1, 2]), ("p1", [1, 2, 3]), ("p2", [4])]
    results, requests = run_batcher(subs)
    assert results == [1.0, 2.0, 3.0, 1.0]
    assert requests == [[[1], [1, 2, 3], [1, 2], [4]]]


def test_the_token_budget_splits_the_grouped_batch_and_scores_stay_in_place():
    subs = [(f"p{i % 3}", [i] * (i + 1)) for i in range(9)]  # sizes 1..9, groups p0, p1, p2 interleaved
    results, requests = run_batcher(subs, max_tokens=12)
    assert results == [float(i + 1) for i in range(9)]
    assert [[len(ids) for ids in r] for r in requests] == [[1, 4, 7], [2, 5], [8, 3], [6], [9]]


def test_reaching_max_seqs_sends_at_once():
    results, requests = run_batcher([("a", [1]), ("b", [2]), ("a", [3])], max_seqs=2)
    assert results == [1.0, 1.0, 1.0]
    assert requests == [[[1], [2]], [[3]]]


def test_a_failing_request_fails_only_the_samples_it_carried():
    subs = [("a", [1]), ("a", [2]), ("b", [3]), ("b", [4])]
    results, requests = run_batcher(subs, max_seqs=2, fail_when=lambda items: [3] in items)
    assert results[:2] == [1.0, 1.0]
    assert [type(r) for r in results[2:]] == [RuntimeError, RuntimeError]
    assert "server said no" in str(results[2])
    assert len(requests) == 2


def test_cancel_in_flight_fails_the_queued_callers():
    async def go():
        started = asyncio.Event()

        async def never(items):
            started.set()
            await asyncio.sleep(3600)

        batcher = GroupBatcher(never, coalesce_s=0.0, max_seqs=1, max_tokens=100)
        first = asyncio.ensure_future(batcher.submit("a", [1]))
        await started.wait()
        assert batcher.in_flight == 1
        await batcher.cancel_in_flight()
        assert batcher.in_flight == 0
        with pytest.raises(RuntimeError, match="scoring interrupted"):
            await first

    asyncio.run(go())
