"""The one orchestration of the ``vllm_rm`` manager: a set of samples, each scored to its own result or error.

Both of verl's entry points go through :meth:`Orchestration.score_samples`: ``run_single``
(the rows of one event-loop iteration, via :class:`~verl_vllm_rm.scoring.row_queue.RowQueue`)
and the batch ``__call__`` (one batch). Each sample is routed by its ``data_source``,
started (its requests queued to every RM of its route, its reference, judge, rule rewards and
verl's ``compute_score`` running) and then finished (answers awaited, composed).

Error semantics, the same for both entry points:

* each sample settles its own future: a sample that cannot be read, routed or started (an
  overlong input under ``overlong_policy=error``, a missing reference under
  ``missing_reference=raise``) or whose scoring fails under ``failure_policy=raise`` gets its own
  error, and the others are scored as if alone (``failure_policy=mask`` masks instead:
  ``rm_valid`` 0, never a number);
* ``run_single`` raises its row's error to verl; the batch call raises the first error and
  stops the rest of the batch (the step fails);
* when the set is cancelled (the batch call failing, ``close()``), the requests and side tasks
  of every started sample are cancelled instead of being left queued.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterable

from verl_vllm_rm.client.batching import fail, fail_all
from verl_vllm_rm.rewards.steps import token_rewards
from verl_vllm_rm.rows import Sample, reference_text
from verl_vllm_rm.scoring.pairwise import MissingReferenceError, win_metrics
from verl_vllm_rm.scoring.reward_model import RewardModel
from verl_vllm_rm.scoring.rm_answers import member_answer, reference_score, rm_info
from verl_vllm_rm.scoring.rm_inputs import RMInput
from verl_vllm_rm.scoring.routing import Route
from verl_vllm_rm.scoring.verifiable import SCORE_KEY


@dataclass(slots=True)
class _Started:
    """A sample between ``_start`` and ``_finish``: its queued requests (one per RM) and its other parts, running."""

    sample: Sample
    route: Route
    rm_inputs: list[RMInput]
    answers: list[asyncio.Future]
    submitted: float
    pairwise: bool
    reference_text: str | None
    reference: asyncio.Future | None  # of each member's reference answer (or its error), asked beside the sample
    judge: asyncio.Future | None
    components: asyncio.Future | None  # of the rule components
    verifiable: asyncio.Future | None

    def futures(self) -> list[asyncio.Future]:
        return [*self.answers, *(f for f in (self.reference, self.judge, self.components, self.verifiable) if f)]


class Orchestration:
    """The scoring half of :class:`~verl_vllm_rm.scoring.manager.VLLMRewardManager`, which builds what it uses:
    ``options``, ``tokenizer``, ``loop``, ``verifiable``, ``reward_models``, ``router``, ``judge``,
    ``examiner``, ``info_keys``, ``per_member`` and the counters ``failed``/``references_missing``."""

    _ready = False  # every RM's max_model_len known (_probe)

    async def score_samples(self, samples: list[Sample | Exception], futures: list[asyncio.Future], *,
                            complete: bool) -> None:
        """Settle each future with its sample's result (``reward_score``, ``reward_extra_info``) or its own error.

        ``samples`` may hold a row's read error in its place. ``complete``: no further samples come before
        these are answered (the batch call), so their requests go out now instead of after ``coalesce_ms``.
        A failure of what the samples share (the servers' probe) reaches every sample still waiting.
        """
        try:
            await self._score_samples(samples, futures, complete)
        except Exception as e:
            fail_all(futures, e)

    async def _score_samples(self, samples: list[Sample | Exception], futures: list[asyncio.Future],
                             complete: bool) -> None:
        live = []
        for future, sample in zip(futures, samples):
            try:
                if isinstance(sample, Exception):
                    raise sample
                live.append((future, sample, self.router.route(sample.fields.get("data_source", ""))))
            except Exception as e:
                fail(future, e)
        await self._probe({rm for *_, route in live for rm in route.members})
        started: list[tuple[asyncio.Future, _Started]] = []
        try:
            for future, sample, route in live:
                try:
                    started.append((future, self._start(sample, route)))
                except Exception as e:
                    fail(future, e)
            if complete:
                for rm in self.reward_models.values():
                    rm.batcher.flush()
            for future, s in started:
                try:
                    result = await self._finish(s)
                except Exception as e:
                    fail(future, e)
                else:
                    if not future.done():
                        future.set_result(result)
        except BaseException:  # cancelled: stop what was started; the caller tells the waiting callers
            await self._abandon([s for _, s in started])
            raise

    async def _abandon(self, started: list[_Started]) -> None:
        """Stop the requests and side tasks of samples that will not be finished, instead of leaving them queued."""
        pending = [f for s in started for f in s.futures()]
        for future in pending:
            future.cancel()
        cancels = [rm.batcher.cancel_in_flight() for rm in self.reward_models.values()]
        await asyncio.gather(*pending, *cancels, return_exceptions=True)

    async def _probe(self, members: Iterable[RewardModel]) -> None:
        """Each RM's ``max_model_len`` known (its server asked once a run), as :meth:`_start` needs."""
        if self._ready:
            return
        await asyncio.gather(*(rm.max_len() for rm in members if not rm.ready))
        self._ready = all(rm.ready for rm in self.reward_models.values())

    def _start(self, sample: Sample, route: Route) -> _Started:
        """Queue the sample's requests to its RMs and start its other parts (reference, judge, rules, verl's
        compute_score); :meth:`_finish` awaits them."""
        members = route.members
        rm_inputs = [rm.rm_input(sample) for rm in members]  # these two raise before anything is queued
        pairwise = self.options.pairwise == "always" or (self.options.pairwise == "auto" and sample.validate)
        ref_text = self._reference_text(sample, rm_inputs) if pairwise and members else None
        submitted = time.perf_counter()
        answers = [rm.submit(rm_input) for rm, rm_input in zip(members, rm_inputs)]
        # asked beside the sample's requests (most often in the same request, so on its version); paired in _finish
        reference = None if ref_text is None else asyncio.ensure_future(asyncio.gather(
            *(rm.reference_score(sample, i, ref_text) for rm, i in zip(members, rm_inputs)), return_exceptions=True))
        rules = route.rules
        needs_text = rules.needs_verifiable or rules.has_rules or rules.needs_judge
        text = self.tokenizer.decode(sample.response_ids, skip_special_tokens=True) if needs_text else ""
        return _Started(
            sample, route, rm_inputs, answers, submitted, pairwise, ref_text, reference,
            judge=asyncio.ensure_future(self.judge.score(sample, text)) if rules.needs_judge else None,
            components=rules.start(self.loop, self.tokenizer, sample, text, self.options.reference_source)
            if rules.has_rules else None,
            verifiable=asyncio.ensure_future(self.verifiable.score(self.loop, sample.fields, text))
            if rules.needs_verifiable else None)

    async def _finish(self, s: _Started) -> dict:
        # no closure, comprehension or coroutine per member here before the awaits: what a sample's frame holds
        # while its answer is awaited lives through garbage collections, which the per-row path pays for
        try:
            components = await s.components if s.components is not None else {}
            verifiable, extras = await s.verifiable if s.verifiable is not None else (None, {})
            outcomes: list[Any] = []
            for future in s.answers:
                try:
                    outcomes.append(await future)
                except Exception as e:  # under the member's failure policy (member_answer)
                    outcomes.append(e)
            ensemble = len(self.reward_models) > 1
            answers = [member_answer(rm, outcome, rm_input, ensemble=ensemble)
                       for rm, outcome, rm_input in zip(s.route.members, outcomes, s.rm_inputs)]
            judged, judge_info = await s.judge if s.judge is not None else (None, {})
            reference = None  # the reference's score; also None when a member under failure_policy=mask failed on it
            if s.reference is not None:  # each member's answer for the sample paired with its reference's
                answers, reference = await reference_score(s.sample, s.reference_text, s.route, s.route.members,
                                                           s.rm_inputs, answers, await s.reference)
        except BaseException:
            for task in (s.reference, s.judge):
                if task is not None:
                    task.cancel()
            raise
        sample, route, members, rules = s.sample, s.route, s.route.members, s.route.rules
        info = dict.fromkeys(self.info_keys)
        info.update(rm_info(route, members, s.rm_inputs, answers, s.submitted, learn=not sample.validate,
                            per_member=self.per_member))
        info.update(judge_info)
        valid = info["rm_valid"] != 0.0 and info.get("judge_valid") != 0.0
        if not valid:
            self.failed += 1
        total = rules.total(components, verifiable, judged, info["rm_score"]) if valid else 0.0
        reward_score: float | list[float] = total
        if valid and route.token_level:  # each step's share of the reward on its step tag (assemble_rm_scores)
            rm, (scored, _) = members[0], answers[0]
            reward_score = token_rewards(sample.response_ids, rm.step_tag_id, rm.response_steps(
                scored, s.rm_inputs[0]), partial(rules.total, components, verifiable, judged))
        info.update(score=total, **components)
        if verifiable is not None:
            info[SCORE_KEY] = verifiable
            info.update(extras)
        if valid and reference is not None:  # else the win keys stay None (no RM, no reference, a failed score)
            info.update(win_metrics(info["rm_score"], reference))
        self.examiner.maybe_print(sample, info)
        return {"reward_score": reward_score, "reward_extra_info": info}

    def _reference_text(self, sample: Sample, rm_inputs: list[RMInput]) -> str | None:
        """The prompt's reference answer (None: none, missing_reference=skip)."""
        text = reference_text(sample.fields, self.options.reference_source)
        if text is not None:
            return text
        if self.options.missing_reference == "skip":
            self.references_missing += 1
            return None
        raise MissingReferenceError(
            f"sample uid={rm_inputs[0].group_key[1]} has no reference answer in "
            f"reference_source={self.options.reference_source!r}; add it to the data, choose another "
            "reward_kwargs.reference_source, or set reward_kwargs.missing_reference=skip")
