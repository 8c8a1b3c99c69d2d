"""``JudgeClient``: a generative judge served by vLLM, asked through the scoring client's machinery.

Each judgement is one ``POST /v1/chat/completions`` (our server with ``--runner generate``, or
any vLLM OpenAI-compatible server) sent by :class:`VLLMRewardClient`: the same pooled session,
concurrency bound, deadline, retries and fail-over as ``/score``. The answer is generated under
vLLM's structured output (:func:`verl_vllm_rm.rewards.judge.answer_constraint`) and read strictly:
an answer cut at ``max_tokens`` or not in its schema raises :class:`JudgeAnswerError` (the
caller's failure policy decides), it never becomes a score.

A prompt group is judged by mode: ``pointwise`` asks once per response, ``listwise`` once for
the whole group, ``pairwise`` once per response against the reference answer
(``pairwise_against=reference``) or once per pair of members (``group``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Sequence

from verl_vllm_rm.rewards.judge import (
    DEFAULT_TEMPLATES, MAX_LISTWISE, JudgeAnswerError, answer_constraint, pairwise_scores, parse_answer,
    pointwise_scores, ranking_scores, render_prompt,
)
from verl_vllm_rm.client.reward_client import VLLMRewardClient
from verl_vllm_rm.judge.options import JudgeOptions

CHAT_PATH = "/v1/chat/completions"
#: a pairwise verdict against the reference as a score: won 1, tie 0, lost -1 (response is A, reference B)
VERDICT_SCORE = {"A": 1.0, "tie": 0.0, "B": -1.0}


@dataclass
class Judgement:
    """One prompt group's judgement: a score in [-1, 1] per response, and what the judge said."""

    scores: list[float]
    answers: list[str]  # the raw answer text of each call, in call order
    ranking: list[int] | None = None  # listwise: 0-based response indices, best first
    verdicts: dict[tuple[int, int], str] | None = None  # pairwise among members: (i, j) -> "A" (i won) | "B" | "tie"
    raw: list[int | str] | None = None  # pointwise scores 1-10, or each response's verdict against the reference
    prompt_tokens: int = 0
    calls: int = 0


@dataclass
class _Answer:
    value: Any
    text: str
    prompt_tokens: int


class JudgeClient:
    """Judges prompt groups on the judge server(s) of ``options``."""

    def __init__(self, options: JudgeOptions) -> None:
        self.options = options
        self.template = options.template or DEFAULT_TEMPLATES[options.mode]
        self.client = VLLMRewardClient(options=options.client)

    async def judge_group(self, prompt: str, responses: Sequence[str], reference: str | None = None) -> Judgement:
        """Scores for the responses of one prompt (all of them: listwise and pairwise among members need the
        whole group). Raises :class:`JudgeAnswerError` for an answer that does not parse, and the client's
        ``RewardServerError`` for a judge that cannot be reached in time."""
        opts, n = self.options, len(responses)
        if opts.mode == "listwise":
            if n > MAX_LISTWISE:
                raise ValueError(f"a listwise judge ranks at most {MAX_LISTWISE} responses, this group has {n}")
            (answer,) = await self._ask_all([(prompt, list(responses))], n)
            return Judgement(ranking_scores(answer.value), [answer.text], ranking=answer.value,
                             prompt_tokens=answer.prompt_tokens, calls=1)
        if opts.mode == "pointwise":
            answers = await self._ask_all([(prompt, [r]) for r in responses], 1)
            raw = [a.value for a in answers]
            return self._judgement(pointwise_scores(raw), answers, raw=raw)
        if opts.pairwise_against == "reference":
            if reference is None:
                raise ValueError("pairwise_against=reference needs the prompt's reference answer; this sample has "
                                 "none (give one, or judge pairwise_against=group)")
            answers = await self._ask_all([(prompt, [r, reference]) for r in responses], 2)
            raw = [a.value for a in answers]
            return self._judgement([VERDICT_SCORE[v] for v in raw], answers, raw=raw)
        pairs = list(combinations(range(n), 2))
        answers = await self._ask_all([(prompt, [responses[i], responses[j]]) for i, j in pairs], 2)
        verdicts = {pair: a.value for pair, a in zip(pairs, answers)}
        return self._judgement(pairwise_scores(n, verdicts, opts.aggregation), answers, verdicts=verdicts)

    async def close(self) -> None:
        await self.client.close()

    # -- internals ----------------------------------------------------------------
    @staticmethod
    def _judgement(scores: list[float], answers: list[_Answer], **said: Any) -> Judgement:
        return Judgement(scores, [a.text for a in answers], prompt_tokens=sum(a.prompt_tokens for a in answers),
                         calls=len(answers), **said)

    async def _ask_all(self, asks: list[tuple[str, list[str]]], n: int) -> list[_Answer]:
        return list(await asyncio.gather(*(self._ask(prompt, shown, n) for prompt, shown in asks)))

    async def _ask(self, prompt: str, shown: list[str], n: int) -> _Answer:
        opts = self.options
        text = render_prompt(opts.mode, self.template, opts.principles, prompt, shown)
        payload: dict[str, Any] = {
            "messages": [{"role": "user", "content": text}], "max_tokens": opts.max_tokens,
            "temperature": opts.temperature, "structured_outputs": answer_constraint(opts.mode, n),
        }
        if opts.client.model:
            payload["model"] = opts.client.model
        answer, prompt_tokens = await self.client.post(CHAT_PATH, payload, validate=_completion)
        return _Answer(parse_answer(opts.mode, answer, n), answer, prompt_tokens)


def _completion(body: Any) -> tuple[str, int]:
    """The answer's text and prompt tokens; an answer cut at ``max_tokens`` cannot be whole."""
    try:
        choice = body["choices"][0]
        text, finish = choice["message"]["content"], choice.get("finish_reason")
        prompt_tokens = int(body.get("usage", {}).get("prompt_tokens", 0))
    except (KeyError, IndexError, TypeError, ValueError):
        raise JudgeAnswerError(f"the judge's reply is not a chat completion: {_excerpt(body)}; judge.server_url "
                               "must be an OpenAI-compatible server answering /v1/chat/completions (vLLM's, or "
                               "python -m verl_vllm_rm.server --runner generate)") from None
    if not isinstance(text, str):
        raise JudgeAnswerError(f"the judge's reply has no answer text (message.content): {_excerpt(body)}; a "
                               "reasoning or tool-call parser on the judge server moves the answer out of it: serve "
                               "the judge without one")
    if finish == "length":
        raise JudgeAnswerError(f"the judge's answer was cut at max_tokens (raise the judge's max_tokens): {text!r}")
    return text, prompt_tokens


def _excerpt(body: Any) -> str:
    """The reply's first 200 characters, as the JSON it came as."""
    return json.dumps(body, default=str)[:200]
