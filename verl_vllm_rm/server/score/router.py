"""The reward routes added to vLLM's app: /health, /score, /runtime_version, /get_world_size."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from verl_vllm_rm.server.score.serving import score_token_ids
from verl_vllm_rm.server.gate import UpdateGate
from verl_vllm_rm.protocol.errors import RequestError, error_body
from verl_vllm_rm.protocol.score import check_token_ids, parse_score_request

ROUTES = ("/health", "/score", "/runtime_version", "/get_world_size")


@dataclass
class RewardServerState:
    """What the reward routes need besides the engine; lives in ``app.state.reward``."""

    served_models: list[str]
    max_model_len: int
    vocab_size: int
    world_size: int
    step_tag_id: int | None
    max_score_batch: int
    max_request_bytes: int
    version: int = 0
    last_update: dict[str, Any] = field(default_factory=dict)
    last_failed_update: dict[str, Any] = field(default_factory=dict)
    pending_update: int | None = None  # the version being received or applied
    gate: UpdateGate = field(default_factory=UpdateGate)


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, status), status_code=status)


def _tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"request body of {declared} bytes exceeds --max-request-bytes {limit}", 413)
    body = await request.body()
    if len(body) > limit:
        raise RequestError(f"request body of {len(body)} bytes exceeds --max-request-bytes {limit}", 413)
    return body


router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state: RewardServerState = request.app.state.reward
    try:
        await request.app.state.engine_client.check_health()
    except Exception as e:  # the engine is dead: say so, with the cause
        return JSONResponse({"status": "error", "type": "reward_model", "error": str(e)}, status_code=503)
    body = {
        "status": "ok",
        "type": "reward_model",
        "model": state.served_models[0],
        "version": state.version,
        "max_model_len": state.max_model_len,
        "step_tag_id": state.step_tag_id,
    }
    if state.pending_update is not None:
        body["pending_update"] = state.pending_update
    if state.last_update:
        body["last_update"] = state.last_update
    if state.last_failed_update:
        body["last_failed_update"] = state.last_failed_update
    return JSONResponse(body)


@router.post("/score")
async def score(request: Request) -> JSONResponse:
    state: RewardServerState = request.app.state.reward
    engine = request.app.state.engine_client
    try:
        body = await read_body(request, state.max_request_bytes)
        req = parse_score_request(body, state.served_models, state.max_score_batch)
        if req.texts is not None:
            tokenizer = engine.renderer.get_tokenizer()
            token_ids = await asyncio.get_running_loop().run_in_executor(None, _tokenize, tokenizer, req.texts)
        else:
            token_ids = req.token_ids
        check_token_ids(token_ids, state.vocab_size, state.max_model_len)
    except RequestError as e:
        return _error(e.message, e.status)
    try:
        async with state.gate.scoring():  # a weight update never lands halfway through a request
            results = await score_token_ids(
                engine, token_ids, normalize=req.normalize, steps=state.step_tag_id is not None
            )
    except Exception as e:  # engine-side failure: a 5xx the client may retry
        return _error(f"scoring failed on the server: {type(e).__name__}: {e}", 500)
    data = []
    for i, r in enumerate(results):
        item: dict[str, Any] = {"index": i, "score": r.score}
        if r.step_scores is not None:
            item["step_scores"] = r.step_scores
        data.append(item)
    model = req.model or state.served_models[0]
    return JSONResponse({"model": model, "data": data, "usage": {"prompt_tokens": sum(map(len, token_ids))}})


@router.get("/runtime_version")
async def runtime_version(request: Request) -> JSONResponse:
    return JSONResponse({"version": request.app.state.reward.version})


@router.get("/get_world_size")
async def get_world_size(request: Request) -> JSONResponse:
    return JSONResponse({"world_size": request.app.state.reward.world_size})


def install_reward_routes(app: FastAPI) -> None:
    """Mount our routes, replacing vLLM's routes of the same path.

    vLLM serves its own ``/health`` (empty 200) and a cross-encoder ``/score``
    that would shadow ours, so those route objects are dropped.
    """
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ROUTES]
    app.include_router(router)
