"""What a scorer is: a batch of rows in, one column per ``reward_extra_info`` key and per reward component out.

The pipeline (:mod:`verl_vllm_rm.scoring.pipeline`) hands every scorer the same :class:`Batch` and composes their
:class:`Scores`. A scorer declares its columns once (:attr:`Scorer.columns`, names from
:mod:`verl_vllm_rm.extra_info`) and gives a value for every row of the batch (None where the row has none), so a
new reward source is one new scorer and its options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import asyncio
from typing import Any, Awaitable, Iterable, Protocol, Sequence, TypeVar

import numpy as np

from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.routing import Route

T = TypeVar("T")


@dataclass(slots=True)
class Batch:
    """The rows one pipeline run scores, each with its route, and the decoded response of each row a scorer
    reads as text ("" for the others)."""

    samples: list[Sample]
    routes: list[Route]
    texts: list[str]
    #: verl's batch ``__call__``: every row is here, so requests go out at once (no waiting for more rows), and a
    #: row's error fails the whole batch (the step), so what is still queued is stopped instead of sent
    batch_call: bool

    def __len__(self) -> int:
        return len(self.samples)


@dataclass(slots=True)
class Scores:
    """One scorer's answer for a batch.

    ``columns``: its ``reward_extra_info`` columns, a value per row (None: none). ``components``: the reward
    components it gives the composition (``rubric``, ``judge``, ``format``, ...), a float per row (NaN: none).
    ``masked``: the rows whose reward it masks (a failure under ``failure_policy=mask``: their reward is 0.0,
    never a number made up). ``errors``: each row's own error (None: scored); an erred row gets no reward.
    ``token_steps``: token-level step rewards by row (its response's step scores and the index of the policy token
    ending each step).
    """

    columns: dict[str, list[Any]]
    components: dict[str, np.ndarray] = field(default_factory=dict)
    masked: np.ndarray | None = None
    errors: list[BaseException | None] | None = None
    token_steps: dict[int, tuple[list[float], list[int]]] = field(default_factory=dict)

    def fail(self, row: int, error: Exception, *, stop: bool) -> None:
        """``row``'s own error; with ``stop`` (:attr:`Batch.batch_call`) the whole batch's, raised at once."""
        self.errors[row] = error
        if stop:
            raise error

    async def gather_rows(self, rows: Sequence[int], calls: Iterable[Awaitable[T]], *, stop: bool
                          ) -> list[tuple[int, T]]:
        """One call per row, run concurrently: each failure is its row's error (:meth:`fail`); the rows that
        answered, with their answers."""
        answered = []
        for row, result in zip(rows, await asyncio.gather(*calls, return_exceptions=True)):
            if isinstance(result, Exception):
                self.fail(row, result, stop=stop)
            elif isinstance(result, BaseException):  # cancelled: the run stops
                raise result
            else:
                answered.append((row, result))
        return answered

    @classmethod
    def empty(cls, size: int, columns: Sequence[str], components: Sequence[str] = ()) -> Scores:
        """No value yet for any of ``size`` rows: every column None, every component NaN, nothing masked."""
        return cls({key: [None] * size for key in columns}, {name: np.full(size, np.nan) for name in components},
                   np.zeros(size, dtype=bool), [None] * size)


class Scorer(Protocol):
    """One reward source of the pipeline."""

    #: the ``reward_extra_info`` columns it writes, each on every row
    columns: tuple[str, ...]

    async def score(self, batch: Batch) -> Scores:
        """Every row's values; a failure of one row is that row's error (:attr:`Scores.errors`), a failure of what
        the rows share (a server's probe) is raised and reaches every row."""
        ...

    async def close(self) -> None:
        """Release what it holds (HTTP sessions); the pipeline closes each scorer once."""
        ...
