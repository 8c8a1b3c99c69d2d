"""The one scoring path of the ``vllm_rm`` manager: a list of rows in, each row's reward or its own error out.

Both of verl's entry points feed it: ``run_single`` (the rows of one event-loop iteration, gathered by
:class:`~verl_vllm_rm.scoring.row_queue.RowQueue`) and the batch ``__call__`` (one batch). Each row is routed by
its ``data_source``; every scorer (the reward models, the rules, verl's ``compute_score``, the judge) scores all
rows at once; the route's composition combines their component arrays into the reward.

Error semantics, the same for both entry points:

* each row gets its own result or error: a row that cannot be read, routed or scored (an overlong input under
  ``overlong_policy=error``, a missing reference under ``missing_reference=raise``, a failed score under
  ``failure_policy=raise``) gets its error, the first in scorer order, and the others are scored as if alone;
  ``failure_policy=mask`` masks instead (``rm_valid`` 0, reward 0.0, never a number made up);
* a failure of what the rows share (a server's probe) reaches every row;
* when a run is cancelled (the batch call failing, ``close()``), each scorer stops what it asked instead of leaving
  it queued.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Sequence

import numpy as np

from verl_vllm_rm.extra_info import SCORE, TOKEN_REWARDS
from verl_vllm_rm.rewards.steps import token_rewards
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.examiner import Examiner
from verl_vllm_rm.scoring.routing import Route, Router
from verl_vllm_rm.scoring.scorer import Batch, Scorer

#: {"reward_score": float | list[float] (token-level, batch call), "reward_extra_info": {column: value}}
Result = dict[str, Any]


class ScoringPipeline:
    def __init__(self, router: Router, scorers: Sequence[Scorer], tokenizer: Any, examiner: Examiner):
        self.router, self.scorers, self.tokenizer, self.examiner = router, list(scorers), tokenizer, examiner
        #: every row's ``reward_extra_info`` keys, in order: the reward, then each scorer's columns
        self.columns = (SCORE, *(key for scorer in self.scorers for key in scorer.columns))
        if clashes := sorted(k for k, n in Counter(self.columns).items() if n > 1):
            # internal: the scorers refuse the clashing names users choose; this stops a new scorer whose columns clash
            raise RuntimeError(f"two reward sources both write the reward_extra_info columns {clashes}")
        self.failed = 0  # rows masked (their reward 0.0)
        #: a route gives token-level step rewards (``step_reward=token``)
        self.token_level = any(route.token_level for route in router.routes)

    async def score(self, samples: Sequence[Sample | Exception], *, batch_call: bool) -> list[Result | Exception]:
        """Each row's result or its own error (``samples`` may hold a row's read error in its place).
        ``batch_call``: verl's batch call (:attr:`Batch.batch_call`): a row's error is raised, and what the batch
        still has queued is stopped."""
        results: list[Result | Exception | None] = [None] * len(samples)
        live: list[int] = []
        routes: list[Route] = []
        for i, sample in enumerate(samples):
            try:
                if isinstance(sample, Exception):
                    raise sample
                routes.append(self.router.route(sample.fields.get("data_source", "")))
                live.append(i)
            except Exception as e:
                if batch_call:
                    raise
                results[i] = e
        if live:
            rows = [samples[i] for i in live]
            batch = Batch(rows, routes, self._texts(rows, routes), batch_call)
            try:
                for i, result in zip(live, await self._score(batch)):
                    results[i] = result
            except Exception as e:  # what the rows share failed (or, in the batch call, a row): every row hears it
                if batch_call:
                    raise
                for i in live:
                    results[i] = e
        if batch_call and (error := next((r for r in results if isinstance(r, Exception)), None)):
            raise error
        return results

    async def _score(self, batch: Batch) -> list[Result | Exception]:
        tasks = [asyncio.ensure_future(scorer.score(batch)) for scorer in self.scorers]
        try:
            outputs = await asyncio.gather(*tasks)
        except BaseException:  # one scorer failed for every row (or the run is cancelled): the others stop too
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        errors = [next((s.errors[i] for s in outputs if s.errors[i] is not None), None) for i in range(len(batch))]
        components: dict[str, np.ndarray] = {}
        for scores in outputs:
            components.update(scores.components)
        masked = np.logical_or.reduce([s.masked for s in outputs])
        totals = self._totals(batch, components, masked, errors)
        token_steps = {i: steps for s in outputs for i, steps in s.token_steps.items()}
        results: list[Result | Exception] = []
        for i, (sample, error) in enumerate(zip(batch.samples, errors)):
            if error is not None:
                results.append(error)
                continue
            info = {SCORE: float(totals[i])}
            for scores in outputs:
                for key, column in scores.columns.items():
                    info[key] = column[i]
            try:
                reward = self._token_rewards(sample, batch.routes[i], components, i, token_steps[i]) \
                    if i in token_steps else info[SCORE]
            except Exception as e:
                results.append(e)
                continue
            if self.token_level and not batch.batch_call:
                # verl's agent loop keeps one scalar: the trainer mode places a training row's tokens before the
                # advantage (validation reads the sum alone)
                placed = isinstance(reward, list) and not sample.validate
                info[TOKEN_REWARDS] = reward if placed else None
                reward = info[SCORE]
            self.examiner.maybe_print(sample, info)
            results.append({"reward_score": reward, "reward_extra_info": info})
        self.failed += int(np.count_nonzero(masked & np.array([e is None for e in errors])))
        return results

    def _totals(self, batch: Batch, components: dict[str, np.ndarray], masked: np.ndarray,
                errors: list[BaseException | None]) -> np.ndarray:
        """Each row's reward by its route's composition over the component arrays; 0.0 for a masked row."""
        totals = np.zeros(len(batch))
        for composition in self.router.compositions:
            rows = np.array([i for i, route in enumerate(batch.routes)
                             if route.composition is composition and errors[i] is None], dtype=np.int64)
            if rows.size:
                totals[rows] = composition.total({name: column[rows] for name, column in components.items()})
        totals[masked] = 0.0
        return totals

    @staticmethod
    def _token_rewards(sample: Sample, route: Route, components: dict[str, np.ndarray], row: int,
                       steps: tuple[list[float], list[int]]) -> list[float]:
        """Token-level step rewards: the composed reward is linear in the RM component, so each step's score
        lands on the token that ends the step with the weight the composition gives the RM, and the rest on the
        last token."""
        at = {name: column[row:row + 1] for name, column in components.items()}
        rest = float(route.composition.total({**at, "rubric": np.zeros(1)})[0])
        coef = float(route.composition.total({**at, "rubric": np.ones(1)})[0]) - rest
        scores, positions = steps
        return token_rewards(len(sample.response_ids), positions, scores, coef, rest)

    def _texts(self, samples: list[Sample], routes: list[Route]) -> list[str]:
        """The decoded response of each row whose composition reads text ("" for the others)."""
        return [self.tokenizer.decode(s.response_ids, skip_special_tokens=True) if r.composition.needs_text else ""
                for s, r in zip(samples, routes)]

    async def close(self) -> None:
        await asyncio.gather(*(scorer.close() for scorer in self.scorers))
