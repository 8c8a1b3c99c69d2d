"""``VLLMRewardManager``, registered in verl's reward loop as ``vllm_rm``.

Thin orchestration: route each trajectory by its ``data_source`` (``routing``), send it
to every reward model of its route at once (``reward_model``: input, grouped requests,
scale), combine their scores (``rewards.ensemble``), optionally call verl's
``compute_score``, and compose the reward (``rules``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score
from verl_vllm_rm.rewards.compose import rule_keys
from verl_vllm_rm.rewards.steps import token_rewards
from verl_vllm_rm.scoring.judging import JUDGE_KEYS, SampleJudge
from verl_vllm_rm.scoring.legacy import warn_misrouted_config
from verl_vllm_rm.scoring.options import ConfigError, ManagerOptions, parse_options, reward_kwargs_of
from verl_vllm_rm.scoring.pairwise import NO_WIN_METRICS, MissingReferenceError, reference_text, win_metrics
from verl_vllm_rm.scoring.reward_model import RewardModel, refuse_token_level_when_streaming
from verl_vllm_rm.scoring.rm_answers import member_answer, rm_info
from verl_vllm_rm.scoring.routing import Route, Router
from verl_vllm_rm.scoring.rules import RuleScorer, batch_stats, verifiable_score
from verl_vllm_rm.scoring.rm_inputs import RMInput, Sample, sample_of_row, samples_from_batch


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

    def __init__(
        self,
        config: DictConfig,
        tokenizer: Any,
        compute_score=None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        **_: Any,
    ):
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
        self.info_keys = self._info_keys()
        #: set around verl's validation by trainer mode vllm_rm (mark_validation): verl's per-trajectory reward
        #: call carries no validate flag
        self.validating = False
        self.last_batch_stats: dict[str, float] = {}
        self._examined: Counter = Counter()
        self.failed = 0
        self.references_missing = 0

    # -- verl reward-loop API -----------------------------------------------------------
    async def run_single(self, data: DataProto) -> dict:
        sample = sample_of_row(data, validate=self.validating)
        route, members = self._route(sample)
        await self._probe(members)
        return await self._finish(self._start(sample, route, members))

    def __call__(self, data: DataProto, return_dict: bool = False):
        """Legacy batch API: a reward tensor shaped like ``responses`` (score at the last valid token).
        Every sample is queued before the first is awaited: no task per sample, one request per budget."""
        async def score_all():
            samples = samples_from_batch(data, validate=self.validating)
            routes = [self._route(sample) for sample in samples]
            await self._probe({rm for _, members in routes for rm in members})
            started: list[_Started] = []
            try:
                for sample, route in zip(samples, routes):  # a loop: a sample that fails to start (an overlong
                    started.append(self._start(sample, *route))  # input) leaves the started ones to cancel below
                for rm in self.reward_models.values():  # every sample is queued: send now, no coalescing window
                    rm.batcher.flush()
                return [await self._finish(s) for s in started]
            except BaseException:  # the step fails: stop its other requests instead of leaving them queued
                pending = [f for s in started for f in s.futures()]
                for future in pending:
                    future.cancel()
                cancels = [rm.batcher.cancel_in_flight() for rm in self.reward_models.values()]
                await asyncio.gather(*pending, *cancels, return_exceptions=True)
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
            await asyncio.gather(*(rm.close() for rm in self.reward_models.values()), *judge)

        self.loop.run_until_complete(close_all())

    # -- parts ----------------------------------------------------------------------
    def _info_keys(self) -> tuple[str, ...]:
        """Every ``reward_extra_info`` key a sample can get: each sample gets all of them (None where its route
        has no such value), because verl builds its columns from the first sample's keys."""
        keys = ["score", "rm_score", "rm_valid", "rm_prompt_tokens_dropped", "rm_tokens", "rm_latency_ms",
                "rm_weight_version"]
        if self.per_member:
            keys.append("rm_ensemble_std")
            for name, rm in self.reward_models.items():
                keys += [f"rm_score_{name}", f"rm_valid_{name}"]
                keys += [f"rm_scaled_{name}"] if rm.whitening is not None else []
        for rules in self.router.rule_scorers:
            keys += [k for k in rule_keys(rules.config) if k not in keys]
        if any(rules.needs_verifiable for rules in self.router.rule_scorers):
            keys.append("verifiable_score")
        if self.judge is not None:
            keys += JUDGE_KEYS
        return tuple(keys)

    def _route(self, sample: Sample) -> tuple[Route, list[RewardModel]]:
        route = self.router.route(sample.fields.get("data_source", ""))
        return route, [self.reward_models[name] for name in route.reward_models]

    @staticmethod
    async def _probe(members) -> None:
        """Each RM's ``max_model_len`` known (its server asked once a run), as :meth:`_start` needs."""
        if not all(rm.ready for rm in members):
            await asyncio.gather(*(rm.max_len() for rm in members))

    def _start(self, sample: Sample, route: Route, members: list[RewardModel]) -> _Started:
        """Queue the sample's requests to its RMs and start its other parts (reference, judge, rules, verl's
        compute_score); :meth:`_finish` awaits them."""
        rm_inputs = [rm.rm_input(sample) for rm in members]
        submitted = time.perf_counter()
        answers = [rm.submit(rm_input) for rm, rm_input in zip(members, rm_inputs)]
        pairwise = self.options.pairwise == "always" or (self.options.pairwise == "auto" and sample.validate)
        reference = asyncio.ensure_future(self._reference_score(sample, route, members, rm_inputs)) \
            if pairwise and members else None
        rules = route.rules
        needs_text = rules.needs_verifiable or rules.has_rules or rules.needs_judge
        text = self.tokenizer.decode(sample.response_ids, skip_special_tokens=True) if needs_text else ""
        return _Started(
            sample, route, members, rm_inputs, answers, submitted, pairwise, reference,
            judge=asyncio.ensure_future(self.judge.score(sample, text)) if rules.needs_judge else None,
            components=self._rule_components(rules, sample, text) if rules.has_rules else None,
            verifiable=asyncio.ensure_future(verifiable_score(self.compute_score, self.loop, sample, text))
            if rules.needs_verifiable else None)

    async def _finish(self, s: _Started) -> dict:
        sample, route, members, rm_inputs, rules = s.sample, s.route, s.members, s.rm_inputs, s.route.rules
        try:
            components = await s.components if s.components is not None else {}
            verifiable, extras = await s.verifiable if s.verifiable is not None else (None, {})
            answers = [await member_answer(rm, future, rm_input, ensemble=len(self.reward_models) > 1)
                       for rm, future, rm_input in zip(members, s.answers, rm_inputs)]
            judged, judge_info = await s.judge if s.judge is not None else (None, {})
        except BaseException:
            for task in (s.reference, s.judge):
                if task is not None:
                    task.cancel()
            raise
        info = dict.fromkeys(self.info_keys)
        info.update(rm_info(route, members, rm_inputs, answers, s.submitted, learn=not sample.validate,
                            per_member=self.per_member))
        info.update(judge_info)
        valid = info["rm_valid"] != 0.0 and info.get("judge_valid") != 0.0
        if not valid:
            self.failed += 1

        def total_of(rm_value: float | None) -> float:
            return rules.total({**components, "rubric": rm_value, "verifiable": verifiable, "judge": judged})

        total = total_of(info["rm_score"]) if valid else 0.0
        reward_score: float | list[float] = total
        if valid and route.token_level:  # each step's share of the reward on its step tag (assemble_rm_scores)
            rm, (scored, _) = members[0], answers[0]
            reward_score = token_rewards(sample.response_ids, rm.step_tag_id, rm.response_steps(scored, rm_inputs[0]),
                                         total_of)
        info.update(score=total, **components)
        if verifiable is not None:
            info.update(verifiable_score=verifiable, **extras)
        if s.pairwise and s.reference is None:  # a route without RMs: no win rate, same keys as the others
            info.update(NO_WIN_METRICS)
        if s.reference is not None:
            try:
                reference = await s.reference
            except MissingReferenceError:
                raise
            except Exception:  # the reference's score failed like the sample's would: same policy
                if any(rm.options.failure_policy == "raise" for rm in members):
                    raise
                reference = None
            info.update(win_metrics(info["rm_score"], reference) if valid and reference is not None
                        else NO_WIN_METRICS)
        self._maybe_print(sample, info)
        return {"reward_score": reward_score, "reward_extra_info": info}

    async def _reference_score(self, sample: Sample, route: Route, members: list[RewardModel],
                               rm_inputs: list[RMInput]) -> float | None:
        """The route's ensemble score of the prompt's reference answer, each member's scored once per prompt
        (None when skipped). Whitened members use their current scale; a reference never updates it."""
        text = reference_text(sample.fields, self.options.reference_source)
        if text is None:
            if self.options.missing_reference == "skip":
                self.references_missing += 1
                return None
            raise MissingReferenceError(
                f"sample uid={rm_inputs[0].group_key[1]} has no reference answer in "
                f"reference_source={self.options.reference_source!r}; add it to the data, choose another "
                "reward_kwargs.reference_source, or set reward_kwargs.missing_reference=skip"
            )
        raw = await asyncio.gather(*(rm.reference_score(sample, i, text) for rm, i in zip(members, rm_inputs)))
        return route.combine([rm.scale(x, update=False) for rm, x in zip(members, raw)])[0]

    def _rule_components(self, rules: RuleScorer, sample: Sample, text: str) -> asyncio.Future:
        """The rule components, as a future: computed inline, or in a thread when rm-gallery rewards run."""
        if not rules.gallery:  # vectorised numpy on one row: cheaper inline than in a thread
            done = self.loop.create_future()
            done.set_result(rules.components(sample.response_ids, text, "", None))
            return done
        prompt = self.tokenizer.decode(sample.prompt_ids, skip_special_tokens=True)
        reference = reference_text(sample.fields, self.options.reference_source)
        # rm-gallery rewards (LLM judges) may block on HTTP: keep them off the event loop
        return self.loop.run_in_executor(None, rules.components, sample.response_ids, text, prompt, reference)

    def _maybe_print(self, sample: Sample, info: dict) -> None:
        source = sample.fields.get("data_source", "unknown")
        if self._examined[source] >= self.options.num_examine:
            return
        self._examined[source] += 1
        print(f"[vllm_rm] data_source={source}")
        print("[prompt]", self.tokenizer.decode(sample.prompt_ids, skip_special_tokens=True))
        print("[response]", self.tokenizer.decode(sample.response_ids, skip_special_tokens=True))
        for key, value in info.items():
            print(f"[{key}]", round(value, 6) if isinstance(value, float) else value)
