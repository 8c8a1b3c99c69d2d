"""The reward-model scorer: each row asked of every RM of its route at once, and (pairwise) compared with the
prompt's reference answer.

For a batch: every row's inputs are built (an overlong input under ``overlong_policy=error``, a missing reference
under ``missing_reference=raise`` is that row's error, before anything is queued); all requests are queued at
once, each RM grouping its rows by prompt (:class:`~verl_vllm_rm.client.batching.GroupBatcher`), and the
reference answers beside them; then each row's answers are read in order (whitening statistics move in row
order), under each member's ``failure_policy`` (:mod:`.rm_answers`). The comparison with the reference is a stage
of this scorer, not a scorer of its own: pairing a row with its reference on one weight version may score the
row again (:func:`~verl_vllm_rm.scoring.rm_answers.paired_answers`), which replaces the RM's own answer.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from verl_vllm_rm.extra_info import (
    RM_ENSEMBLE_STD,
    RM_KEYS,
    RM_PROMPT_TOKENS_DROPPED,
    RM_SCORE,
    RM_TOKENS,
    RM_VALID,
    WIN_KEYS,
    attribute_key,
    ensembled_attribute_keys,
    member_keys,
    member_scaled_key,
    scaled_attribute_key,
)
from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.rows import Sample, reference_text
from verl_vllm_rm.scoring.options import ManagerOptions, per_member_columns
from verl_vllm_rm.scoring.pairwise import MissingReferenceError, win_metrics
from verl_vllm_rm.scoring.reward_model import RewardModel
from verl_vllm_rm.scoring.rm_answers import member_answer, reference_score, rm_info
from verl_vllm_rm.scoring.rm_inputs import RMInput
from verl_vllm_rm.scoring.routing import Route, Router
from verl_vllm_rm.scoring.scorer import Batch, Scores


def rm_columns(reward_models: Mapping[str, RewardModel], per_member: bool,
               ensembled_attributes: Iterable[str]) -> tuple[str, ...]:
    """The RM columns: the ensemble and its bookkeeping, each weighted attribute (raw, whitened, ensembled per
    attribute), and with ``per_member`` each RM's own. Refuses names that run into each other."""
    keys = list(RM_KEYS)
    for name, rm in reward_models.items():
        for attribute in rm.attribute_names:
            keys += [attribute_key(name, attribute)]
            keys += [scaled_attribute_key(name, attribute)] if rm.attribute_whitenings else []
    for attribute in ensembled_attributes:
        keys += ensembled_attribute_keys(attribute)
    if per_member:
        keys.append(RM_ENSEMBLE_STD)
        for name, rm in reward_models.items():
            keys += member_keys(name)
            keys += [member_scaled_key(name)] if rm.whitenings else []
    if clashes := sorted(key for key, count in Counter(keys).items() if count > 1):
        raise ConfigError(
            f"the reward_extra_info keys {clashes} would each hold two values: reward model and attribute names are "
            "joined with '_' (rm_attr_<rm>_<attribute>, rm_attr_scaled_<rm>_<attribute>), and two of them run into "
            "each other; rename a reward model (reward_models[].name)")
    return tuple(keys)


@dataclass(slots=True)
class _Asked:
    """A row between its requests going out and its answers being read."""

    row: int
    inputs: list[RMInput]
    submitted: float  # when its requests went out (rm_latency_ms)
    answers: list[asyncio.Future]  # one per member of its route
    reference_text: str | None
    references: asyncio.Future | None  # of each member's reference answer (or its error)


def member_inputs(sample: Sample, members: Sequence[RewardModel]
                  ) -> tuple[list[RMInput], list[Exception | None] | None]:
    """Each member's input for the sample, and (None when all were built) why each one that could not be was not.
    A member under ``failure_policy=raise`` raises at once; under ``mask`` its refusal becomes its answer (an
    empty input is kept in its place), so the row is masked for it, as for a failed request."""
    inputs: list[RMInput] = []
    refused: list[Exception | None] | None = None
    for k, rm in enumerate(members):
        try:
            inputs.append(rm.rm_input(sample))
        except Exception as e:
            if rm.options.failure_policy == "raise":
                raise
            refused = refused or [None] * len(members)
            refused[k] = e
            inputs.append(RMInput(np.zeros(0, dtype=np.int64), sample.group_key, 0))
    return inputs, refused


def failed(error: Exception) -> asyncio.Future:
    """A future already failed with ``error`` (a member's answer whose input could not be built)."""
    future = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


class RewardModelScorer:
    def __init__(self, options: ManagerOptions, router: Router, reward_models: Mapping[str, RewardModel]):
        self.options, self.router, self.reward_models = options, router, reward_models
        #: per-RM columns (``rm_score_<name>``, ...): with several RMs, or a whitened one
        self.per_member = per_member_columns(options.rm_options)
        self.pairwise = options.pairwise != "never"
        self.columns = rm_columns(reward_models, self.per_member, router.ensembled_attributes) + (
            WIN_KEYS if self.pairwise else ())
        self.references_missing = 0
        self._ready = False  # every RM's max_model_len known (probe)

    async def score(self, batch: Batch) -> Scores:
        out = Scores.empty(len(batch), self.columns, ("rubric",))
        for i, route in enumerate(batch.routes):
            if not route.members:  # nothing asked: no tokens, nothing failed
                out.columns[RM_PROMPT_TOKENS_DROPPED][i] = out.columns[RM_TOKENS][i] = 0.0
        await self.probe({rm for route in batch.routes for rm in route.members})
        asked: list[_Asked] = []
        try:
            for i, (sample, route) in enumerate(zip(batch.samples, batch.routes)):
                if route.members:
                    try:
                        asked.append(self._ask(i, sample, route))
                    except Exception as e:
                        out.fail(i, e, stop=batch.batch_call)
            # several rows at once (the batch call, or verl handing a batch's rows to run_single in one loop
            # iteration, gathered by the row queue) go out now; a lone row waits coalesce_ms for others
            if batch.batch_call or len(asked) > 1:
                for rm in self.reward_models.values():
                    rm.batcher.flush()
            for a in asked:
                try:
                    await self._read(a, batch, out)
                except Exception as e:
                    out.fail(a.row, e, stop=batch.batch_call)
        except BaseException:  # cancelled, or the batch failed: stop what was asked instead of leaving it queued
            await self._abandon(asked)
            raise
        return out

    async def probe(self, members: Iterable[RewardModel]) -> None:
        """Each RM's ``max_model_len`` known (its server asked once a run), as building an input needs."""
        if self._ready:
            return
        await asyncio.gather(*(rm.max_len() for rm in members if not rm.ready))
        self._ready = all(rm.ready for rm in self.reward_models.values())

    def _ask(self, row: int, sample: Sample, route: Route) -> _Asked:
        members = route.members
        inputs, refused = member_inputs(sample, members)  # these two raise before anything is queued
        pairwise = self.options.pairwise == "always" or (self.options.pairwise == "auto" and sample.validate)
        text = self._reference_text(sample, inputs) if pairwise else None
        submitted = time.perf_counter()
        answers = [rm.submit(rm_input) if refused is None or refused[k] is None else failed(refused[k])
                   for k, (rm, rm_input) in enumerate(zip(members, inputs))]
        # asked beside the row's requests (most often in the same request, so on its version); paired in _read
        references = None if text is None else asyncio.ensure_future(asyncio.gather(
            *(rm.reference_score(sample, i, text) for rm, i in zip(members, inputs)), return_exceptions=True))
        return _Asked(row, inputs, submitted, answers, text, references)

    async def _read(self, a: _Asked, batch: Batch, out: Scores) -> None:
        # no closure, comprehension or coroutine per member here before the awaits: what a row's frame holds
        # while its answer is awaited lives through garbage collections, which the per-row path pays for
        sample, route = batch.samples[a.row], batch.routes[a.row]
        try:
            outcomes: list[Any] = []
            for future in a.answers:
                try:
                    outcomes.append(await future)
                except Exception as e:  # under the member's failure policy (member_answer)
                    outcomes.append(e)
            ensemble = len(self.reward_models) > 1
            answers = [member_answer(rm, outcome, rm_input, ensemble=ensemble)
                       for rm, outcome, rm_input in zip(route.members, outcomes, a.inputs)]
            reference = None  # the reference's score; also None when a member under failure_policy=mask failed on it
            if a.references is not None:  # each member's answer for the row paired with its reference's
                answers, reference = await reference_score(sample, a.reference_text, route, route.members, a.inputs,
                                                           answers, await a.references)
        except BaseException:
            if a.references is not None:
                a.references.cancel()
            raise
        info = rm_info(route, route.members, a.inputs, answers, a.submitted, learn=not sample.validate,
                       per_member=self.per_member)
        if info[RM_VALID] and reference is not None:  # else the win keys stay None (no reference, a failed score)
            info.update(win_metrics(info[RM_SCORE], reference))
        for key, value in info.items():
            out.columns[key][a.row] = value
        out.components["rubric"][a.row] = info[RM_SCORE]
        out.masked[a.row] = not info[RM_VALID]
        if route.token_level and info[RM_VALID]:  # each step's share of the reward on the token ending the step
            rm, (scored, _) = route.members[0], answers[0]
            out.token_steps[a.row] = (rm.response_steps(scored, a.inputs[0]),
                                      rm.step_token_positions(sample.response_ids))

    async def _abandon(self, asked: list[_Asked]) -> None:
        pending = [f for a in asked for f in (*a.answers, a.references) if f is not None]
        for future in pending:
            future.cancel()
        cancels = [rm.batcher.cancel_in_flight() for rm in self.reward_models.values()]
        await asyncio.gather(*pending, *cancels, return_exceptions=True)

    def _reference_text(self, sample: Sample, inputs: list[RMInput]) -> str | None:
        """The prompt's reference answer (None: none, missing_reference=skip)."""
        text = reference_text(sample.fields, self.options.reference_source)
        if text is not None:
            return text
        if self.options.missing_reference == "skip":
            self.references_missing += 1
            return None
        raise MissingReferenceError(
            f"sample uid={inputs[0].group_key[1]} has no reference answer in "
            f"reference_source={self.options.reference_source!r}; add it to the data, choose another "
            "reward_kwargs.reference_source, or set reward_kwargs.missing_reference=skip")

    async def close(self) -> None:
        await asyncio.gather(*(rm.close() for rm in self.reward_models.values()))
