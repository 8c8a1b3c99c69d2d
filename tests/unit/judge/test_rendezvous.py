"""The group rendezvous on one event loop (pure: the judge is a function recording what it was given; the real
judge and verl's Ray workers are in tests/integration/scoring/test_judging.py)."""

from __future__ import annotations

import asyncio

import pytest

from verl_vllm_rm.judge.rendezvous import GroupIncompleteError, GroupRendezvous


class Recorder:
    def __init__(self, fail: bool = False):
        self.calls: list[list] = []
        self.fail = fail

    async def __call__(self, payloads: list) -> str:
        self.calls.append(payloads)
        await asyncio.sleep(0)
        if self.fail:
            raise RuntimeError("judge down")
        return f"judged {payloads}"


def run(coro):
    return asyncio.run(coro)


def test_a_complete_group_is_judged_once_in_member_order():
    judge = Recorder()
    rv = GroupRendezvous(judge)

    async def go():
        return await asyncio.gather(*(rv.join("g", m, f"p{m}", 3, 5.0) for m in (2, 0, 1)))

    results = run(go())
    assert judge.calls == [["p0", "p1", "p2"]]  # sorted by member id, whatever the arrival order
    assert results == [("judged ['p0', 'p1', 'p2']", 2), ("judged ['p0', 'p1', 'p2']", 0),
                       ("judged ['p0', 'p1', 'p2']", 1)]
    assert rv.stats.groups_judged == 1 and rv.stats.judged_sizes == {"g": 3} and rv.groups == {}


def test_without_member_ids_members_are_in_arrival_order():
    judge = Recorder()
    rv = GroupRendezvous(judge)

    async def go():
        return await asyncio.gather(*(rv.join("g", None, p, 2, 5.0) for p in ("x", "y")))

    assert [index for _, index in run(go())] == [0, 1] and judge.calls == [["x", "y"]]


def test_an_incomplete_group_fails_every_waiting_member_at_its_deadline_and_late_ones_at_once():
    judge = Recorder()
    rv = GroupRendezvous(judge)

    async def go():
        waiting = await asyncio.gather(rv.join("g", 0, "a", 3, 0.2), rv.join("g", 1, "b", 3, 0.2),
                                       return_exceptions=True)
        with pytest.raises(GroupIncompleteError, match="arrived after its group was given up: group g has 2 of"):
            await asyncio.wait_for(rv.join("g", 2, "c", 3, 0.2), 1.0)  # no new wait: the tombstone answers
        return waiting

    waiting = run(go())
    assert all(isinstance(e, GroupIncompleteError) for e in waiting)
    assert "group g has 2 of its 3 members" in str(waiting[0]) and "(members [0, 1])" in str(waiting[0])
    assert judge.calls == [] and rv.stats.groups_expired == 1 and rv.stats.late_members == 1


def test_a_failed_judgement_fails_every_member_and_later_ones():
    rv = GroupRendezvous(Recorder(fail=True))

    async def go():
        first = await asyncio.gather(rv.join("g", 0, "a", 2, 5.0), rv.join("g", 1, "b", 2, 5.0),
                                     return_exceptions=True)
        with pytest.raises(GroupIncompleteError, match="given up: judge down"):
            await rv.join("g", 2, "c", 2, 5.0)
        return first

    assert [str(e) for e in run(go())] == ["judge down", "judge down"]


def test_one_member_too_many_or_twice_or_another_size_is_an_error():
    rv = GroupRendezvous(Recorder())

    async def go():
        await asyncio.gather(rv.join("g", 0, "a", 2, 5.0), rv.join("g", 1, "b", 2, 5.0))
        with pytest.raises(GroupIncompleteError, match="judged with all its 2 members: more members than"):
            await rv.join("g", 2, "c", 2, 5.0)
        pending = asyncio.ensure_future(rv.join("h", 0, "a", 3, 5.0))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="group h: member 0 joined twice"):
            await rv.join("h", 0, "a", 3, 5.0)
        with pytest.raises(ValueError, match="group h: a member says the group has 2 members, an earlier one 3"):
            await rv.join("h", 1, "b", 2, 5.0)
        pending.cancel()

    run(go())


def test_tombstones_expire():
    rv = GroupRendezvous(Recorder(), tombstone_s=0.05)

    async def go():
        await asyncio.gather(rv.join("g", 0, "a", 1, 5.0))
        assert "g" in rv.tombstones
        await asyncio.sleep(0.1)
        return await rv.join("other", 0, "x", 1, 5.0)  # any join prunes what expired

    run(go())
    assert "g" not in rv.tombstones and "other" in rv.tombstones
