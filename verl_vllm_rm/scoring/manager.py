"""``VLLMRewardManager``, registered in verl's reward loop as ``vllm_rm``.

Thin orchestration: build each trajectory's RM input (``rm_inputs``), hand it to
the group batcher (``batching``) that sends grouped requests through the client
(``client``), optionally call verl's ``compute_score`` and compose the reward (``rules``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score
from verl_vllm_rm.scoring.batching import GroupBatcher
from verl_vllm_rm.scoring.client import VLLMRewardClient
from verl_vllm_rm.scoring.options import ConfigError, ManagerOptions, parse_options
from verl_vllm_rm.scoring.legacy import warn_misrouted_config
from verl_vllm_rm.scoring.pairwise import NO_WIN_METRICS, MissingReferenceError, ReferenceCache, reference_text, win_metrics
from verl_vllm_rm.scoring.rules import RuleScorer, batch_stats, split_verifiable
from verl_vllm_rm.scoring.rm_inputs import (
    RMInput,
    Sample,
    chat_template_ids,
    fit_to_length,
    prompt_text,
    rubric_template_ids,
    samples_from_batch,
)

logger = logging.getLogger(__name__)


def _reward_kwargs(config: DictConfig) -> dict:
    raw = config.get("reward", {}).get("reward_kwargs") if config is not None else None
    return OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else dict(raw or {})


@register("vllm_rm")
class VLLMRewardManager(RewardManagerBase):
    """Scores trajectories with a vLLM-served reward model; options in ``reward.reward_kwargs``."""

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
        self.options: ManagerOptions = parse_options(_reward_kwargs(config))
        self.compute_score = compute_score or default_compute_score
        self.client = VLLMRewardClient(options=self.options.client_options())
        self.batcher = GroupBatcher(
            self._score_chunk,
            coalesce_s=self.options.coalesce_ms / 1000.0,
            max_seqs=self.options.max_batch_seqs,
            max_tokens=self.options.max_batch_tokens,
        )
        self.rm_tokenizer = None
        if self.options.rm_tokenizer_path:
            from transformers import AutoTokenizer

            self.rm_tokenizer = AutoTokenizer.from_pretrained(self.options.rm_tokenizer_path)
        try:
            self.rules = RuleScorer(self.options.reward_config(), tokenizer)
        except ValueError as e:
            raise ConfigError(f"reward_kwargs.rewards: {e}") from e
        self.last_batch_stats: dict[str, float] = {}
        self._max_length: asyncio.Future | None = None  # of the server's max_model_len
        self._examined: Counter = Counter()
        self.references = ReferenceCache()
        self.failed = 0
        self.references_missing = 0

    # -- verl reward-loop API -----------------------------------------------------------
    async def run_single(self, data: DataProto) -> dict:
        return await self._score_sample(samples_from_batch(data)[-1])

    def __call__(self, data: DataProto, return_dict: bool = False):
        """Legacy batch API: a reward tensor shaped like ``responses`` (score at the last valid token)."""

        async def score_all():
            tasks = [asyncio.ensure_future(self._score_sample(s)) for s in samples_from_batch(data)]
            try:
                return await asyncio.gather(*tasks)
            except BaseException:  # the step fails: stop its other requests instead of leaving them queued
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, self.batcher.cancel_in_flight(), return_exceptions=True)
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

    def close(self) -> None:
        """Close this manager's HTTP sessions (verl keeps managers for the whole run)."""
        self.loop.run_until_complete(self.client.close())

    # -- parts ----------------------------------------------------------------------
    async def _score_chunk(self, ids: list) -> list[tuple[float, int, float]]:
        """One /score request: per item (score, weight version that computed it, time the answer came)."""
        scores = await self.client.score_request(ids, normalize=self.options.normalize)
        version, done = -1 if scores.version is None else scores.version, time.perf_counter()
        return [(score, version, done) for score in scores]

    async def _score_sample(self, sample: Sample) -> dict:
        rm_input = await self._rm_input(sample)
        submitted = time.perf_counter()
        rm_score_future = self.batcher.submit(rm_input.group_key, rm_input.token_ids)
        pairwise = self.options.pairwise == "always" or (self.options.pairwise == "auto" and sample.validate)
        ref_task = asyncio.ensure_future(self._reference_score(sample, rm_input)) if pairwise else None
        needs_verifiable = self.rules.needs_verifiable
        needs_text = needs_verifiable or self.rules.has_rules
        text = self.tokenizer.decode(sample.response_ids, skip_special_tokens=True) if needs_text else ""
        rules_future = self._rule_components(sample, text) if self.rules.has_rules else None
        verifiable, extras = await self._verifiable(sample, text) if needs_verifiable else (None, {})
        rules = await rules_future if rules_future is not None else {}
        try:
            (rm_score, version, done), valid = await rm_score_future, 1.0
        except Exception as e:
            if self.options.failure_policy == "raise":
                if ref_task is not None:
                    ref_task.cancel()
                raise
            self.failed += 1
            logger.warning("vllm_rm: masking sample (uid=%s) after a failed score: %s", rm_input.group_key, e)
            rm_score, valid, version, done = 0.0, 0.0, -1, time.perf_counter()
        total = self._total(rm_score, verifiable, rules) if valid else 0.0
        info = {"score": total, "rm_score": rm_score, "rm_valid": valid,
                "rm_prompt_tokens_dropped": float(rm_input.prompt_tokens_dropped),
                "rm_tokens": float(len(rm_input.token_ids)), "rm_latency_ms": (done - submitted) * 1000.0,
                "rm_weight_version": float(version), **rules}
        if verifiable is not None:
            info.update(verifiable_score=verifiable, **extras)
        if ref_task is not None:
            try:
                reference = await ref_task
            except MissingReferenceError:
                raise
            except Exception:  # the reference's score failed like the sample's would: same policy
                if self.options.failure_policy == "raise":
                    raise
                reference = None
            info.update(win_metrics(rm_score, reference) if valid and reference is not None else NO_WIN_METRICS)
        self._maybe_print(sample, info)
        return {"reward_score": total, "reward_extra_info": info}

    async def _max_len(self) -> int:
        """The option, else the server's ``max_model_len``: asked once, shared by all concurrent callers; a
        failed probe is asked again by the next caller, not kept for the whole run."""
        if self.options.max_length is not None:
            return self.options.max_length
        probe = self._max_length
        if probe is None:
            probe = self._max_length = asyncio.ensure_future(self._server_max_len())
        elif probe.done() and probe.exception() is None:
            return probe.result()
        try:
            return await asyncio.shield(probe)
        except Exception:
            if self._max_length is probe:
                self._max_length = None
            raise

    async def _server_max_len(self) -> int:
        return int((await self.client.health())["max_model_len"])

    def _render(self, sample: Sample, response_ids: list[int] | None, response_text: str | None):
        """(prompt part, response part) ids of the RM input for a response given as ids or text."""
        opts = self.options
        if opts.rubric_template is not None or opts.input_format == "chat_template":
            if response_text is None:
                response_text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
            if opts.rubric_template is not None:
                return rubric_template_ids(self.rm_tokenizer or self.tokenizer, opts.rubric_template,
                                           opts.rubric_principles, prompt_text(self.tokenizer, sample), response_text)
            messages = sample.fields.get("raw_prompt")
            if messages is None:
                raise ValueError("input_format=chat_template needs the raw chat: set data.return_raw_chat=True")
            return chat_template_ids(self.rm_tokenizer, list(messages), response_text)
        if response_ids is None:
            response_ids = self.tokenizer(response_text, add_special_tokens=False).input_ids
        return sample.prompt_ids, response_ids

    async def _rm_input(self, sample: Sample) -> RMInput:
        prompt_ids, response_ids = self._render(sample, sample.response_ids, None)
        ids, dropped = fit_to_length(prompt_ids, response_ids, await self._max_len(), self.options.overlong_policy)
        return RMInput(ids, sample.group_key, dropped)

    async def _reference_score(self, sample: Sample, rm_input: RMInput) -> float | None:
        """The RM score of the prompt's reference answer (scored once per prompt; None when skipped)."""
        text = reference_text(sample.fields, self.options.reference_source)
        if text is None:
            if self.options.missing_reference == "skip":
                self.references_missing += 1
                return None
            raise MissingReferenceError(
                f"sample uid={rm_input.group_key[1]} has no reference answer in "
                f"reference_source={self.options.reference_source!r}; add it to the data, choose another "
                "reward_kwargs.reference_source, or set reward_kwargs.missing_reference=skip"
            )
        prompt_ids, ref_ids = self._render(sample, None, text)
        ids, _ = fit_to_length(prompt_ids, ref_ids, await self._max_len(), self.options.overlong_policy)
        scored = await self.references.score((rm_input.group_key, text),
                                             lambda: self.batcher.submit(rm_input.group_key, ids))
        return scored[0]

    def _total(self, rm_score: float, verifiable: float | None, rules: dict[str, float]) -> float:
        return self.rules.total({**rules, "rubric": rm_score, "verifiable": verifiable})

    def _rule_components(self, sample: Sample, text: str) -> asyncio.Future:
        """The rule components, as a future: computed inline, or in a thread when rm-gallery rewards run."""
        if not self.rules.gallery:  # vectorised numpy on one row: cheaper inline than in a thread
            done = self.loop.create_future()
            done.set_result(self.rules.components(sample.response_ids, text, "", None))
            return done
        prompt = self.tokenizer.decode(sample.prompt_ids, skip_special_tokens=True)
        reference = reference_text(sample.fields, self.options.reference_source)
        # rm-gallery rewards (LLM judges) may block on HTTP: keep them off the event loop
        return self.loop.run_in_executor(None, self.rules.components, sample.response_ids, text, prompt, reference)

    async def _verifiable(self, sample: Sample, text: str) -> tuple[float, dict]:
        kwargs = dict(
            data_source=sample.fields["data_source"],
            solution_str=text,
            ground_truth=sample.fields["reward_model"]["ground_truth"],
            extra_info=sample.fields.get("extra_info", {}),
        )
        if inspect.iscoroutinefunction(self.compute_score):
            result = await self.compute_score(**kwargs)
        else:
            result = await self.loop.run_in_executor(None, lambda: self.compute_score(**kwargs))
        return split_verifiable(result)

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
