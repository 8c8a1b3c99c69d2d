"""One named reward model as the manager uses it: input rendering, grouped requests, scale.

Each RM of a run (``reward_kwargs.reward_models``, or the one the top-level options
describe) gets its own client (its servers), its own group batcher (groups coalesce per
RM), its own input format and tokenizer, its ``max_model_len`` and its running
whitening. The manager submits a sample to every RM of its route at once, so the
requests to different RMs for one sample are concurrent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from verl_vllm_rm.rewards.ensemble import RunningWhitening
from verl_vllm_rm.scoring.batching import GroupBatcher
from verl_vllm_rm.scoring.client import VLLMRewardClient
from verl_vllm_rm.scoring.options import RewardModelOptions
from verl_vllm_rm.scoring.pairwise import ReferenceCache
from verl_vllm_rm.scoring.rm_inputs import (
    RMInput,
    Sample,
    chat_template_ids,
    fit_to_length,
    prompt_text,
    rubric_template_ids,
)


@dataclass(frozen=True)
class Scored:
    """One RM's answer for one input: the score, the weight version that computed it, when it came."""

    score: float
    version: int
    done: float


class RewardModel:
    def __init__(self, options: RewardModelOptions, tokenizer: Any, *, coalesce_s: float):
        self.options = options
        self.name = options.name
        self.tokenizer = tokenizer  # the policy's
        self.client = VLLMRewardClient(options=options.client_options())
        self.batcher = GroupBatcher(self._score_chunk, coalesce_s=coalesce_s, max_seqs=options.max_batch_seqs,
                                    max_tokens=options.max_batch_tokens)
        self.rm_tokenizer = None
        if options.rm_tokenizer_path:
            from transformers import AutoTokenizer

            self.rm_tokenizer = AutoTokenizer.from_pretrained(options.rm_tokenizer_path)
        self.whitening = RunningWhitening() if options.whiten == "running" else None
        self.references = ReferenceCache()
        self.failed = 0
        self._max_length: asyncio.Future | None = None  # of the server's max_model_len

    async def rm_input(self, sample: Sample) -> RMInput:
        prompt_ids, response_ids = self.render(sample, sample.response_ids, None)
        ids, dropped = fit_to_length(prompt_ids, response_ids, await self.max_len(), self.options.overlong_policy)
        return RMInput(ids, sample.group_key, dropped)

    def submit(self, rm_input: RMInput) -> asyncio.Future:
        """The future of this input's :class:`Scored` (grouped with its prompt group's other members)."""
        return self.batcher.submit(rm_input.group_key, rm_input.token_ids)

    async def reference_score(self, sample: Sample, rm_input: RMInput, text: str) -> float:
        """The raw score of the prompt's reference answer ``text``, scored once per prompt group."""
        prompt_ids, ref_ids = self.render(sample, None, text)
        ids, _ = fit_to_length(prompt_ids, ref_ids, await self.max_len(), self.options.overlong_policy)
        scored = await self.references.score((rm_input.group_key, text),
                                             lambda: self.batcher.submit(rm_input.group_key, ids))
        return scored.score

    def scale(self, raw: float, *, sample: bool = True) -> float:
        """The score the ensemble uses: whitened (``whiten=running``; a sample also updates the statistics)
        or the raw one."""
        if self.whitening is None:
            return raw
        return self.whitening.update_and_whiten(raw) if sample else self.whitening.whiten(raw)

    async def max_len(self) -> int:
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

    async def _score_chunk(self, ids: list) -> list[Scored]:
        """One /score request."""
        scores = await self.client.score_request(ids, normalize=self.options.normalize)
        version, done = -1 if scores.version is None else scores.version, time.perf_counter()
        return [Scored(score, version, done) for score in scores]

    def render(self, sample: Sample, response_ids: list[int] | None, response_text: str | None):
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

    async def close(self) -> None:
        await self.client.close()
