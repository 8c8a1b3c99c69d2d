"""Score a validated ``/score`` request with the running vLLM engine (pooling runner).

One engine request per sequence, all submitted together: the engine batches them
and its prefix cache shares any common prompt prefix between them.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from vllm.inputs import TokensPrompt
from vllm.pooling_params import PoolingParams

from verl_vllm_rm.protocol.score import ScoreRequest, finite_or_raise, score_response
from verl_vllm_rm.server.state import RewardServerState


@dataclass(frozen=True)
class SequenceScore:
    score: float
    step_scores: list[float] | None = None


async def _pool(engine, token_ids: list[int], params: PoolingParams, request_id: str):
    final = None
    async for output in engine.encode(TokensPrompt(prompt_token_ids=token_ids), params, request_id):
        final = output
    if final is None:
        # internal: vLLM's encode yields a final output or raises; an empty stream would be vLLM out of protocol
        raise RuntimeError(f"engine returned no output for request {request_id}")
    return final.outputs.data


async def _score_one(engine, token_ids: list[int], index: int, normalize: bool, steps: bool, tag: str):
    seq_params = PoolingParams(task="classify", use_activation=normalize)
    jobs = [_pool(engine, token_ids, seq_params, f"{tag}-{index}")]
    if steps:
        step_params = PoolingParams(task="token_classify", use_activation=normalize)
        jobs.append(_pool(engine, token_ids, step_params, f"{tag}-{index}-steps"))
    outputs = await asyncio.gather(*jobs)
    score = finite_or_raise([float(outputs[0].reshape(-1)[0])], index)[0]
    step_scores = None
    if steps:
        per_step = outputs[1].reshape(outputs[1].shape[0], -1)[:, 0] if outputs[1].numel() else outputs[1]
        step_scores = finite_or_raise([float(v) for v in per_step.reshape(-1)], index)
    return SequenceScore(score, step_scores)


async def score_token_ids(
    engine, token_ids: list[list[int]], *, normalize: bool, steps: bool
) -> list[SequenceScore]:
    """Return one score per sequence, in input order (raw logit unless ``normalize``)."""
    tag = f"rm-{uuid.uuid4().hex[:12]}"
    return list(
        await asyncio.gather(
            *(_score_one(engine, ids, i, normalize, steps, tag) for i, ids in enumerate(token_ids))
        )
    )


def _tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]


async def tokenize(engine, texts: list[str]) -> list[list[int]]:
    """The engine's own tokenization of ``texts`` (off the event loop: it is CPU-bound)."""
    tokenizer = engine.renderer.get_tokenizer()
    return await asyncio.get_running_loop().run_in_executor(None, _tokenize, tokenizer, texts)


async def score(engine, state: RewardServerState, req: ScoreRequest, token_ids: list[list[int]]) -> dict[str, Any]:
    """The ``/score`` answer; a weight update never lands halfway through it."""
    steps = state.step_tag_id is not None
    async with state.weights.gate.scoring():  # no update lands inside: the version read here computed every score
        version = state.weights.version
        results = await score_token_ids(engine, token_ids, normalize=req.normalize, steps=steps)
    return score_response(
        req.model or state.served_models[0],
        [r.score for r in results],
        sum(map(len, token_ids)),
        [r.step_scores for r in results] if steps else None,
        version=version,
    )
