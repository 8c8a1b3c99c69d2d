"""``VLLMRewardManager``, registered in verl's reward loop as ``vllm_rm``.

Thin orchestration: route each trajectory by its ``data_source`` (``routing``), send it
to every reward model of its route at once (``reward_model``: input, grouped requests,
scale), combine their scores (``rewards.ensemble``), optionally call verl's
``compute_score``, and compose the reward (``rules``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from omegaconf import DictConfig

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score
from verl_vllm_rm.rewards.steps import token_rewards
from verl_vllm_rm.scoring.batching import fail
from verl_vllm_rm.scoring.extra_info import Examiner, info_keys
from verl_vllm_rm.scoring.judging import SampleJudge
from verl_vllm_rm.scoring.legacy import warn_misrouted_config
from verl_vllm_rm.scoring.options import ConfigError, ManagerOptions, parse_options, reward_kwargs_of
from verl_vllm_rm.scoring.pairwise import NO_WIN_METRICS, MissingReferenceError, reference_text, win_metrics
from verl_vllm_rm.scoring.reward_model import RewardModel, refuse_token_level_when_streaming
from verl_vllm_rm.scoring.rm_answers import member_answer, reference_score, rm_info
from verl_vllm_rm.scoring.routing import Route, Router
from verl_vllm_rm.scoring.row_queue import Row, RowQueue
from verl_vllm_rm.scoring.rules import batch_stats, verifiable_score
from verl_vllm_rm.scoring.rm_inputs import RMInput, Sample, samples_of, samples_of_rows


@dataclass(slots=True)
class _Started:
    """A sample between ``_start`` and ``_finish``: its queued requests (one per RM) and its other parts, running."""

    sample: Sample
    route: Route
    members: list[RewardModel]
    rm_inputs: list[RMInput]
    answers: list[asyncio.Future]
    submitted: float
    pairwise: bool
    reference: asyncio.Future | None
    judge: asyncio.Future | None
    components: asyncio.Future | None  # of the rule components
    verifiable: asyncio.Future | None

    def futures(self) -> list[asyncio.Future]:
        return [*self.answers, *(f for f in (self.reference, self.judge, self.components, self.verifiable) if f)]


@register("vllm_rm")
class VLLMRewardManager(RewardManagerBase):
    """Scores trajectories with vLLM-served reward models; options in ``reward.reward_kwargs``."""

    def __init__(self, config: DictConfig, tokenizer: Any, compute_score=None,
                 reward_router_address: str | None = None, reward_model_tokenizer: Any = None, **_: Any):
        super().__init__(config, tokenizer, compute_score)
        warn_misrouted_config(config)
        self.options: ManagerOptions = parse_options(reward_kwargs_of(config))
        self.compute_score = compute_score or default_compute_score
        coalesce_s = self.options.coalesce_ms / 1000.0
        try:
            rm_options = self.options.reward_model_options()
            self.router = Router(self.options, tokenizer)
            self.judge = SampleJudge(self.options, config, tokenizer) if self.options.judge is not None else None
        except ValueError as e:
            raise ConfigError(str(e)) from e
        refuse_token_level_when_streaming(config, rm_options)
        self.reward_models = {o.name: RewardModel(o, tokenizer, coalesce_s=coalesce_s) for o in rm_options}
        #: per-RM keys in reward_extra_info: with several RMs, or a whitened one
        self.per_member = len(self.reward_models) > 1 or any(o.whiten != "none" for o in rm_options)
        self.info_keys = info_keys(self.reward_models, self.per_member, self.router.rule_scorers,
                                   judge=self.judge is not None)
        #: set around verl's validation by trainer mode vllm_rm (mark_validation): verl's per-trajectory reward
        #: call carries no validate flag
        self.validating = False
        self.last_batch_stats: dict[str, float] = {}
        self._routes: dict[str, tuple[Route, list[RewardModel]]] = {}  # by data_source
        self._ready = False  # every RM's max_model_len known (_probe)
        self._row_queue = RowQueue(self._score_rows)
        self.examiner = Examiner(tokenizer, self.options.num_examine)
        self.failed = 0
        self.references_missing = 0

    # -- verl reward-loop API -----------------------------------------------------------
    async def run_single(self, data: DataProto) -> dict:
        """One row's reward: the rows verl hands over in one loop iteration are scored together (RowQueue)."""
        return await self._row_queue.put(data)

    def __call__(self, data: DataProto, return_dict: bool = False):
        """Legacy batch API: a reward tensor shaped like ``responses`` (score at the last valid token).
        Every sample is queued before the first is awaited: no task per sample, one request per budget."""
        async def score_all():
            samples = samples_of([data], validate=self.validating)
            routes = [self._route(sample) for sample in samples]
            await self._probe({rm for _, members in routes for rm in members})
            started: list[_Started] = []
            try:
                for sample, route in zip(samples, routes):  # a loop: a sample that fails to start (an overlong
                    started.append(self._start(sample, *route))  # input) leaves the started ones to cancel below
                for rm in self.reward_models.values():  # every sample is queued: send now, no coalescing window
                    rm.batcher.flush()
                return [await self._finish(s) for s in started]
            except BaseException:  # the step fails
                await self._abandon(started)
                raise

        outputs = self.loop.run_until_complete(score_all())
        self.last_batch_stats = batch_stats([o["reward_extra_info"] for o in outputs])
        reward_tensor = self.assemble_rm_scores(data, [o["reward_score"] for o in outputs])
        if not return_dict:
            return reward_tensor
        keys = outputs[0]["reward_extra_info"].keys() if outputs else []
        return {
            "reward_tensor": reward_tensor,
            "reward_extra_info": {k: [o["reward_extra_info"][k] for o in outputs] for k in keys},
        }

    async def _score_rows(self, rows: list[Row]) -> None:
        """verl's per-row calls of one loop iteration, as one loop over the rows; each row gets its own result
        or error, as if scored alone."""
        live = []
        for (_, future), sample in zip(rows, samples_of_rows([data for data, _ in rows], validate=self.validating)):
            try:
                if isinstance(sample, Exception):
                    raise sample
                live.append((future, sample, self._route(sample)))
            except Exception as e:
                fail(future, e)
        await self._probe({rm for *_, (_, members) in live for rm in members})
        started: list[tuple[asyncio.Future, _Started]] = []
        try:
            for future, sample, route in live:
                try:
                    started.append((future, self._start(sample, *route)))
                except Exception as e:
                    fail(future, e)
            for future, s in started:
                try:
                    result = await self._finish(s)
                except Exception as e:
                    fail(future, e)
                else:
                    if not future.done():
                        future.set_result(result)
        except BaseException:  # cancelled (close): the RowQueue tells the callers
            await self._abandon([s for _, s in started])
            raise

    async def _abandon(self, started: list[_Started]) -> None:
        """Stop the requests and side tasks of samples that will not be finished, instead of leaving them queued."""
        pending = [f for s in started for f in s.futures()]
        for future in pending:
            future.cancel()
        cancels = [rm.batcher.cancel_in_flight() for rm in self.reward_models.values()]
        await asyncio.gather(*pending, *cancels, return_exceptions=True)

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list) -> torch.Tensor:
        """verl's placement (each scalar at the last valid response token), and token-level step rewards
        (``step_reward=token``: a list per response) over the response's first tokens."""
        if not any(isinstance(s, list) for s in scores):
            return super().assemble_rm_scores(data, scores)
        scalars = [0.0 if isinstance(s, list) else s for s in scores]
        rm_scores = super().assemble_rm_scores(data, scalars)
        for i, s in enumerate(scores):
            if isinstance(s, list):
                rm_scores[i, : len(s)] = rm_scores.new_tensor(s)
        return rm_scores

    @property
    def rm(self) -> RewardModel:
        """The one reward model of a single-RM run."""
        if len(self.reward_models) != 1:
            raise AttributeError(f"this run has {len(self.reward_models)} reward models: use reward_models[name]")
        return next(iter(self.reward_models.values()))

    async def warm_up(self) -> None:
        """Connect to every RM's server and read its ``max_model_len`` (otherwise done by the first sample)."""
        await self._probe(self.reward_models.values())

    def close(self) -> None:
        """Close this manager's HTTP sessions (verl keeps managers for the whole run)."""
        async def close_all() -> None:
            judge = [self.judge.close()] if self.judge is not None else []
            await self._row_queue.close()
            await asyncio.gather(*(rm.close() for rm in self.reward_models.values()), *judge)

        self.loop.run_until_complete(close_all())

    # -- parts ----------------------------------------------------------------------
    def _route(self, sample: Sample) -> tuple[Route, list[RewardModel]]:
        source = sample.fields.get("data_source", "")
        found = self._routes.get(source)
        if found is None:
            route = self.router.route(source)
            found = self._routes[source] = (route, [self.reward_models[name] for name in route.reward_models])
        return found

    async def _probe(self, members) -> None:
        """Each RM's ``max_model_len`` known (its server asked once a run), as :meth:`_start` needs."""
        if self._ready:
            return
        await asyncio.gather(*(rm.max_len() for rm in members if not rm.ready))
        self._ready = all(rm.ready for rm in self.reward_models.values())

    def _start(self, sample: Sample, route: Route, members: list[RewardModel]) -> _Started:
        """Queue the sample's requests to its RMs and start its other parts (reference, judge, rules, verl's
        compute_score); :meth:`_finish` awaits them."""
        rm_inputs = [rm.rm_input(sample) for rm in members]  # these two raise before anything is queued
        pairwise = self.options.pairwise == "always" or (self.options.pairwise == "auto" and sample.validate)
        reference = self._reference(sample, route, members, rm_inputs) if pairwise and members else None
        submitted = time.perf_counter()
        answers = [rm.submit(rm_input) for rm, rm_input in zip(members, rm_inputs)]
        rules = route.rules
        needs_text = rules.needs_verifiable or rules.has_rules or rules.needs_judge
        text = self.tokenizer.decode(sample.response_ids, skip_special_tokens=True) if needs_text else ""
        return _Started(
            sample, route, members, rm_inputs, answers, submitted, pairwise, reference,
            judge=asyncio.ensure_future(self.judge.score(sample, text)) if rules.needs_judge else None,
            components=rules.start(self.loop, self.tokenizer, sample, text, self.options.reference_source)
            if rules.has_rules else None,
            verifiable=asyncio.ensure_future(verifiable_score(self.compute_score, self.loop, sample, text))
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
                       for rm, outcome, rm_input in zip(s.members, outcomes, s.rm_inputs)]
            judged, judge_info = await s.judge if s.judge is not None else (None, {})
        except BaseException:
            for task in (s.reference, s.judge):
                if task is not None:
                    task.cancel()
            raise
        sample, route, members, rules = s.sample, s.route, s.members, s.route.rules
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
            info.update(verifiable_score=verifiable, **extras)
        if s.pairwise and s.reference is None:  # no RM or no reference (skipped): same keys as the others
            info.update(NO_WIN_METRICS)
        if s.reference is not None:
            try:
                reference = await s.reference
            except Exception:  # the reference's score failed like the sample's would: same policy
                if any(rm.options.failure_policy == "raise" for rm in members):
                    raise
                reference = None
            info.update(win_metrics(info["rm_score"], reference) if valid and reference is not None
                        else NO_WIN_METRICS)
        self.examiner.maybe_print(sample, info)
        return {"reward_score": reward_score, "reward_extra_info": info}

    def _reference(self, sample: Sample, route: Route, members: list[RewardModel],
                   rm_inputs: list[RMInput]) -> asyncio.Future | None:
        """The future of the route's score of the prompt's reference answer (None: none, missing_reference=skip)."""
        text = reference_text(sample.fields, self.options.reference_source)
        if text is not None:
            return asyncio.ensure_future(reference_score(sample, text, route, members, rm_inputs))
        if self.options.missing_reference == "skip":
            self.references_missing += 1
            return None
        raise MissingReferenceError(
            f"sample uid={rm_inputs[0].group_key[1]} has no reference answer in "
            f"reference_source={self.options.reference_source!r}; add it to the data, choose another "
            "reward_kwargs.reference_source, or set reward_kwargs.missing_reference=skip")
