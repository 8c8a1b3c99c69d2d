"""Score a validated ``/score`` request with the running vLLM engine (pooling runner).

One engine request per sequence, all submitted together: the engine batches them
and its prefix cache shares any common prompt prefix between them.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import nullcontext
from typing import Any

from vllm.inputs import TokensPrompt
from vllm.pooling_params import PoolingParams

from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape
from verl_vllm_rm.protocol.score import ScoreRequest, finite_or_raise, score_response
from verl_vllm_rm.server.score.heads import HeadReading, engine_tasks, read_head
from verl_vllm_rm.server.engine_watch import EngineWatch
from verl_vllm_rm.server.state import RewardServerState


async def _pool(engine, token_ids: list[int], params: PoolingParams, request_id: str, watch: EngineWatch | None):
    final = None
    with watch.request() if watch is not None else nullcontext():
        async for output in engine.encode(TokensPrompt(prompt_token_ids=token_ids), params, request_id):
            final = output
    if final is None:
        # internal: vLLM's encode yields a final output or raises; an empty stream would be vLLM out of protocol
        raise RuntimeError(f"engine returned no output for request {request_id}")
    return final.outputs.data


async def _score_one(engine, shape: ModelShape, token_ids: list[int], index: int, normalize: bool,
                     tag: str, watch: EngineWatch | None) -> HeadReading:
    outputs = await asyncio.gather(*(
        _pool(engine, token_ids, PoolingParams(task=task, use_activation=False), f"{tag}-{index}-{k}", watch)
        for k, task in enumerate(engine_tasks(shape))))
    reading = read_head(shape, outputs, normalize)
    for values in (reading.attributes, reading.step_scores):
        if values is not None:
            finite_or_raise(values, index)
    if reading.score is not None:
        finite_or_raise([reading.score], index)
    return reading


async def score_token_ids(engine, shape: ModelShape, token_ids: list[list[int]], *, normalize: bool,
                          watch: EngineWatch | None = None) -> list[HeadReading]:
    """One reading per sequence, in input order (raw unless ``normalize``; see ``heads``); each engine request
    is counted by ``watch``."""
    tag = f"rm-{uuid.uuid4().hex[:12]}"
    return list(await asyncio.gather(
        *(_score_one(engine, shape, ids, i, normalize, tag, watch) for i, ids in enumerate(token_ids))))


async def probe(engine, shape: ModelShape) -> None:
    """One one-token request of the head's first pooling task (the engine watch's idle probe)."""
    params = PoolingParams(task=engine_tasks(shape)[0], use_activation=False)
    await _pool(engine, [0], params, f"probe-{uuid.uuid4().hex[:12]}", None)


def with_reward_token(token_ids: list[list[int]], token: tuple[int, str] | None) -> list[list[int]]:
    """Each input ending with the model's reward token (appended where it does not already end with it)."""
    if token is None:
        return token_ids
    return [ids if not ids or ids[-1] == token[0] else [*ids, token[0]] for ids in token_ids]


def _tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]


async def tokenize(engine, texts: list[str]) -> list[list[int]]:
    """The engine's own tokenization of ``texts`` (off the event loop: it is CPU-bound)."""
    tokenizer = engine.renderer.get_tokenizer()
    return await asyncio.get_running_loop().run_in_executor(None, _tokenize, tokenizer, texts)


async def score(engine, state: RewardServerState, req: ScoreRequest, token_ids: list[list[int]]) -> dict[str, Any]:
    """The ``/score`` answer; a weight update never lands halfway through it."""
    async with state.weights.scoring() as version:  # no update lands inside: this version computes every score
        readings = await score_token_ids(engine, state.shape, token_ids, normalize=req.normalize,
                                         watch=state.engine_watch)
    shape = state.shape
    return score_response(
        req.model or state.served_models[0], [r.score for r in readings], sum(map(len, token_ids)),
        [r.step_scores for r in readings] if shape.reads_steps else None, version=version,
        attributes=[r.attributes for r in readings] if shape.kind is HeadKind.ATTRIBUTES else None,
    )
