"""The reward routes added to vLLM's app: /health, /score, /runtime_version, /get_world_size."""

from __future__ import annotations

import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from verl_vllm_rm.protocol.errors import RequestError
from verl_vllm_rm.protocol.score import check_token_ids, parse_score_request
from verl_vllm_rm.server.score import serving
from verl_vllm_rm.server.state import RewardServerState, error_response, read_body
from verl_vllm_rm.server.weights.state import WeightsLost

ROUTES = ("/health", "/score", "/runtime_version", "/get_world_size")

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state: RewardServerState = request.app.state.reward
    try:
        await request.app.state.engine_client.check_health()
    except Exception as e:  # the engine is dead: say so, with the cause
        return JSONResponse({"status": "error", "type": state.kind, "error": str(e)}, status_code=503)
    if (stalled := engine_stalled(request)) is not None:  # alive, but answers nothing
        return JSONResponse({"status": "error", "type": state.kind, "error": stalled}, status_code=503)
    if state.weights.lost is not None:  # a reload failed and could not be undone: nothing it scores is right
        return JSONResponse({"status": "error", "type": state.kind, "error": state.weights.lost_message(),
                             "version": None, "last_failed_update": state.weights.last_failed_update},
                            status_code=503)
    body = {
        "status": "ok",
        "type": state.kind,
        "model": state.served_models[0],
        "version": state.weights.version,
        "max_model_len": state.max_model_len,
        "step_tag_id": None if state.step_tag is None else state.step_tag[0],
        "step_tag": None if state.step_tag is None else dict(zip(("id", "token"), state.step_tag)),
        "reward_token": None if state.reward_token is None else dict(zip(("id", "token"), state.reward_token)),
        "shape": None if state.shape is None else state.shape.to_json(),
        "scoring": state.scoring.as_dict(),
    }
    if state.weights.inventory is not None and state.weights.inventory.lora_bases is not None:
        bases = state.weights.inventory.lora_bases  # known from the first inventory read on
        body["lora_bases"] = {k: v for k, v in bases.to_json().items() if k != "modules"}
    if state.weights.pending_update is not None:
        body["pending_update"] = state.weights.pending_update
    if state.weights.staged_update is not None:
        body["staged_update"] = state.weights.staged_update["version"]
    if state.weights.last_update:
        body["last_update"] = state.weights.last_update
    if state.weights.last_failed_update:
        body["last_failed_update"] = state.weights.last_failed_update
    return JSONResponse(body)


@router.post("/score")
async def score(request: Request) -> JSONResponse:
    state: RewardServerState = request.app.state.reward
    engine = request.app.state.engine_client
    counters, t0 = state.scoring, time.perf_counter()
    if state.weights.lost is not None:
        counters.failed += 1
        return error_response(state.weights.lost_message(), 503)
    if (stalled := engine_stalled(request)) is not None:  # at once: the client fails over instead of waiting
        counters.failed += 1
        return error_response(stalled, 503)
    if state.kind != "reward_model":
        counters.refused += 1
        return error_response(f"this server serves {state.served_models[0]} as a generative judge (--runner "
                              "generate), which gives no scalar score: send /score to a reward-model server "
                              "(--runner pooling) and judge prompts to /v1/chat/completions", 400)
    try:
        req = parse_score_request(
            await read_body(request, state.max_request_bytes), state.served_models, state.max_score_batch
        )
        token_ids = req.token_ids if req.texts is None else await serving.tokenize(engine, req.texts)
        token_ids = serving.with_reward_token(token_ids, state.reward_token)
        check_token_ids(token_ids, state.vocab_size, state.max_model_len, reward_token=state.reward_token)
    except RequestError as e:
        counters.refused += 1
        return error_response(e.message, e.status)
    try:
        answer = JSONResponse(await serving.score(engine, state, req, token_ids))
    except WeightsLost as e:  # lost while this request waited for a reload
        counters.failed += 1
        return error_response(str(e), 503)
    except Exception as e:  # engine-side failure: a 5xx the client may retry
        counters.failed += 1
        return error_response(f"scoring failed on the server: {type(e).__name__}: {e}", 500)
    finally:
        counters.busy_s += time.perf_counter() - t0
    counters.requests += 1
    counters.inputs += len(token_ids)
    return answer


def engine_stalled(request: Request) -> str | None:
    """Why the engine counts as stalled (None: it answers, or this server is a judge); starts the watch."""
    watch = request.app.state.reward.engine_watch
    if watch is None:
        return None
    watch.ensure_running()
    return watch.stalled


@router.get("/runtime_version")
async def runtime_version(request: Request) -> JSONResponse:
    return JSONResponse({"version": request.app.state.reward.weights.serving_version})


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
