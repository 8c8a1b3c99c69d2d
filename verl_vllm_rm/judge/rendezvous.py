"""Group rendezvous: hold each member of a prompt group until the whole group is there, then judge it once.

A listwise judge (or pairwise among members) needs every response of a prompt, but verl's reward
loop hands trajectories to its workers one by one, each to a random worker
(``random.choice(reward_loop_worker_handles)``). So every member joins the group's rendezvous: the
member that completes the group (``n`` members) starts the one judgement, and every member gets it
with its own index. A group that is not complete ``timeout_s`` after its first member arrived fails
for every member waiting (the failure policy decides), and a member arriving later fails at once
(a tombstone remembers the group): nobody waits forever for a member that never comes.

In one process the rendezvous is a plain object (the batch ``__call__``, or a single reward-loop
worker); across verl's Ray workers it is one named async Ray actor (:func:`rendezvous_actor`), which
judges through its own :class:`JudgeClient`. Cost: one actor round trip per sample (about a
millisecond), and each group waits for its slowest member, which the rollout waits for anyway.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Hashable, Sequence

RENDEZVOUS_ACTOR = "vllm_rm_judge_rendezvous"
JudgeFn = Callable[[list[Any]], Awaitable[Any]]


class GroupIncompleteError(RuntimeError):
    """A prompt group did not complete in time, or a member came after its group was done."""


@dataclass
class _Group:
    n: int
    first: float
    done: asyncio.Future
    timer: asyncio.TimerHandle
    members: dict[Hashable, Any] = field(default_factory=dict)
    order: list[Hashable] = field(default_factory=list)


@dataclass
class RendezvousStats:
    groups_judged: int = 0
    groups_expired: int = 0
    late_members: int = 0
    judged_sizes: dict[str, int] = field(default_factory=dict)  # key -> members judged (kept for the last 10,000)


class GroupRendezvous:
    """Rendezvous of prompt groups on one event loop; ``judge(payloads)`` judges a complete group once."""

    def __init__(self, judge: JudgeFn, tombstone_s: float = 3600.0) -> None:
        self.judge = judge
        self.tombstone_s = tombstone_s
        self.groups: dict[str, _Group] = {}
        self.tombstones: dict[str, Exception | None] = {}  # a finished group: its error, or None (judged)
        self._expiry: deque[tuple[float, str]] = deque()
        self.stats = RendezvousStats()

    async def join(self, key: str, member: Hashable | None, payload: Any, n: int, timeout_s: float) -> tuple[Any, int]:
        """This member's group's judgement and the member's index in the judged order (members sorted by
        ``member``, e.g. verl's ``session_id``; by arrival when ``member`` is None)."""
        self._prune()
        if key in self.tombstones:
            self.stats.late_members += 1
            error = self.tombstones[key]
            raise GroupIncompleteError(f"a member of group {key} arrived after its group was "
                                       + (f"given up: {error}" if error is not None else
                                          f"judged with all its {n} members: more members than the group size, "
                                          "or a member sent twice"))
        group = self.groups.get(key)
        if group is None:
            loop = asyncio.get_running_loop()
            group = _Group(n, time.monotonic(), loop.create_future(), loop.call_later(timeout_s, self._expire, key))
            self.groups[key] = group
        if group.n != n:
            raise ValueError(f"group {key}: a member says the group has {n} members, an earlier one {group.n}")
        member = len(group.order) if member is None else member
        if member in group.members:
            raise ValueError(f"group {key}: member {member!r} joined twice")
        group.members[member] = payload
        group.order.append(member)
        if len(group.members) == n:
            self._complete(key, group)
        judgement, order = await asyncio.shield(group.done)
        return judgement, order.index(member)

    # -- internals ----------------------------------------------------------------
    def _complete(self, key: str, group: _Group) -> None:
        group.timer.cancel()
        del self.groups[key]
        order = sorted(group.order, key=_sort_key)
        task = asyncio.ensure_future(self.judge([group.members[m] for m in order]))

        def settle(t: asyncio.Task) -> None:
            error = t.exception() if not t.cancelled() else asyncio.CancelledError()
            if error is None:
                group.done.set_result((t.result(), order))
                self.stats.groups_judged += 1
                self.stats.judged_sizes[key] = len(order)
                if len(self.stats.judged_sizes) > 10_000:
                    del self.stats.judged_sizes[next(iter(self.stats.judged_sizes))]
            else:
                group.done.set_exception(error)
            self._bury(key, error)

        task.add_done_callback(settle)

    def _expire(self, key: str) -> None:
        group = self.groups.pop(key)
        error = GroupIncompleteError(
            f"group {key} has {len(group.members)} of its {group.n} members {time.monotonic() - group.first:.1f}s "
            f"after the first arrived (members {sorted(group.order, key=_sort_key)}): a member never came, or the "
            "group is smaller than the configured size (judge.group_timeout_s, actor_rollout_ref.rollout.n)")
        self.stats.groups_expired += 1
        group.done.set_exception(error)
        group.done.exception()  # retrieved: no "never retrieved" warning when no member is left to await it
        self._bury(key, error)

    def _bury(self, key: str, error: BaseException | None) -> None:
        self.tombstones[key] = error if isinstance(error, Exception) or error is None else RuntimeError(str(error))
        self._expiry.append((time.monotonic() + self.tombstone_s, key))

    def _prune(self) -> None:
        now = time.monotonic()
        while self._expiry and self._expiry[0][0] <= now:
            self.tombstones.pop(self._expiry.popleft()[1], None)


def _sort_key(member: Hashable) -> tuple[str, Any]:
    return (type(member).__name__, member)


class JudgeRendezvous(GroupRendezvous):
    """The rendezvous that judges with a :class:`JudgeClient` (the class of the named Ray actor)."""

    def __init__(self, options: Any) -> None:
        from verl_vllm_rm.judge.client import JudgeClient

        self.client = JudgeClient(options)
        super().__init__(self._judge)

    async def _judge(self, payloads: Sequence[tuple[str, str, str | None]]) -> Any:
        prompt, _, reference = payloads[0]
        return await self.client.judge_group(prompt, [response for _, response, _ in payloads], reference)

    def stats_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.stats)


def rendezvous_actor(options: Any) -> Any:
    """The run's rendezvous actor: created by the first reward-loop worker that asks, found by the others."""
    import ray

    return ray.remote(JudgeRendezvous).options(
        name=RENDEZVOUS_ACTOR, get_if_exists=True, num_cpus=0, max_concurrency=10_000,
    ).remote(options)
