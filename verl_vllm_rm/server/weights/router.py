"""Weight-update routes (only with ``--enable-weight-updates``): the metadata plane.

``GET /weight_inventory``, ``POST /init_communicator``, ``POST /update_param_batch``,
``POST /close_communicator``. Tensors never cross HTTP: they arrive over the
process group opened by ``/init_communicator`` (see ``worker_extension``).

``/update_param_batch`` answers in NDJSON: a refusal is a plain 4xx before any
tensor moves; an accepted update first sends ``{"status": "accepted"}`` (the
trainer's cue to start broadcasting), then one final line once the update has
been applied or has failed. The update itself runs as a task of its own, so a
trainer that disconnects cannot cancel it halfway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

from verl_vllm_rm.protocol.errors import RequestError
from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.json_body import is_int, parse_json, preview
from verl_vllm_rm.server.state import RewardServerState, error_response, read_body
from verl_vllm_rm.server.weights.join import DEFAULT_JOIN_TIMEOUT_S, JoinTimedOut, join_bound, join_group

logger = logging.getLogger(__name__)
WEIGHT_ROUTES = ("/weight_inventory", "/init_communicator", "/update_param_batch", "/close_communicator")


@dataclass
class WeightSyncState:
    """Weight-update state next to ``app.state.reward``; lives in ``app.state.weight_sync``."""

    transport: str
    head_patterns: tuple[str, ...]
    max_update_bytes: int | None = None
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    inventory: Inventory | None = None
    session: str | None = None
    update_task: asyncio.Task | None = None
    control: asyncio.Lock = field(default_factory=asyncio.Lock)


router = APIRouter()


async def _inventory(request: Request) -> Inventory:
    sync: WeightSyncState = request.app.state.weight_sync
    if sync.inventory is None:
        results = await request.app.state.engine_client.collective_rpc("rm_weight_inventory")
        sync.inventory = Inventory.from_json(results[0])
    return sync.inventory


async def _body(request: Request) -> dict[str, Any]:
    payload = parse_json(await read_body(request, request.app.state.reward.max_request_bytes))
    if not isinstance(payload, dict):
        raise RequestError("request body must be a JSON object")
    return payload


@router.get("/weight_inventory")
async def weight_inventory(request: Request) -> JSONResponse:
    sync: WeightSyncState = request.app.state.weight_sync
    state: RewardServerState = request.app.state.reward
    body = (await _inventory(request)).to_json()
    body.update(
        max_update_bytes=sync.max_update_bytes,
        transport=sync.transport,
        head_patterns=list(sync.head_patterns),
        world_size=state.world_size,
        version=state.version,
    )
    return JSONResponse(body)


def _parse_init(payload: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Check the fields before any worker tries to connect, so a bad one is a 400, not a failed join (502)."""
    address, port, session = payload.get("master_address"), payload.get("master_port"), payload.get("session")
    timeout_s = payload.get("timeout_s", 300.0)
    problems = []
    if not isinstance(address, str) or not address:
        problems.append(f"'master_address' must be a non-empty string, got {preview(address)}")
    if not is_int(port) or not 0 < port < 65536:
        problems.append(f"'master_port' must be an integer port in [1, 65535], got {preview(port)}")
    if not isinstance(session, str) or not session:
        problems.append(f"'session' must be a non-empty string, got {preview(session)}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        problems.append(f"'timeout_s' must be a positive number of seconds, got {preview(timeout_s)}")
    if problems:
        raise RequestError("; ".join(problems))
    return {"master_address": address, "master_port": port, "world_size": world_size, "session": session,
            "timeout_s": float(timeout_s)}


@router.post("/init_communicator")
async def init_communicator(request: Request) -> JSONResponse:
    """Join the trainer's process group: ``{master_address, master_port, session, timeout_s?}``.

    Answers within ``min(timeout_s, --weight-update-join-timeout)`` + ``JOIN_GRACE_S``: 504 when the
    trainer's address did not complete the join in time, 502 when the join failed; scoring goes on.
    """
    sync: WeightSyncState = request.app.state.weight_sync
    state: RewardServerState = request.app.state.reward
    try:
        info = _parse_init(await _body(request), 1 + state.world_size)
    except RequestError as e:
        return error_response(e.message, e.status)
    async with sync.control:
        if sync.update_task is not None and not sync.update_task.done():
            return error_response("a weight update is in progress; retry after it finishes", 409)
        sync.session = None
        bound = join_bound(info["timeout_s"], sync.join_timeout_s)
        try:
            await join_group(request.app.state.engine_client, info, bound)
        except JoinTimedOut as e:
            return error_response(f"could not join the trainer's process group: {e}", 504)
        except Exception as e:
            return error_response(f"could not join the trainer's process group: {type(e).__name__}: {e}", 502)
        sync.session = info["session"]
    return JSONResponse({"status": "ok", "session": sync.session, "world_size": info["world_size"]})


@router.post("/close_communicator")
async def close_communicator(request: Request) -> JSONResponse:
    sync: WeightSyncState = request.app.state.weight_sync
    async with sync.control:
        if sync.update_task is not None and not sync.update_task.done():
            return error_response("a weight update is in progress; retry after it finishes", 409)
        await request.app.state.engine_client.shutdown_weight_transfer_engine()
        sync.session = None
    return JSONResponse({"status": "closed"})


def _parse_update(payload: dict[str, Any], inventory: Inventory, sync: WeightSyncState, version: int):
    unknown = sorted(set(payload) - {"metadata", "training_mode", "version", "bucket_bytes"})
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}; send metadata, training_mode, version, bucket_bytes")
    if not isinstance(payload.get("metadata"), list):
        raise RequestError("'metadata' must be a list of {name, dtype, shape}")
    new_version = payload.get("version")
    if not is_int(new_version) or new_version <= version:
        raise RequestError(
            f"'version' must be an integer greater than the serving version {version}, got {preview(new_version)}", 409
        )
    bucket_bytes = payload.get("bucket_bytes")
    if not is_int(bucket_bytes) or bucket_bytes <= 0:
        raise RequestError(f"'bucket_bytes' must be a positive integer, got {preview(bucket_bytes)}")
    try:
        mode = RewardModelTrainingMode.parse(payload.get("training_mode"))
        specs = [ParamSpec.from_json(p) for p in payload["metadata"]]
        inventory.check_update(specs, mode, sync.head_patterns, max_bytes=sync.max_update_bytes)
    except (ValueError, WeightUpdateRefused) as e:
        raise RequestError(str(e)) from None
    return specs, mode, new_version, bucket_bytes


RECEIVE_POLL_S = 0.005


async def _receive(engine, specs: list[ParamSpec], bucket_bytes: int) -> None:
    """Start the workers' background receive and wait for it without blocking the engine.

    A long ``collective_rpc`` would hold the engine's loop (and every score) for the
    whole transfer; short polls let scoring go on with the old weights meanwhile.
    The final ``join`` raises the receive's error through vLLM's own lifecycle, which
    then clears its update state.
    """
    await engine.start_weight_update()
    info = {"params": [s.to_json() for s in specs], "bucket_bytes": bucket_bytes}
    await engine.update_weights(WeightTransferUpdateRequest({**info, "phase": "begin"}))
    while not all(await engine.collective_rpc("rm_receive_done")):
        await asyncio.sleep(RECEIVE_POLL_S)
    await engine.update_weights(WeightTransferUpdateRequest({**info, "phase": "join"}))


async def _apply_update(
    app: FastAPI, specs: list[ParamSpec], mode: RewardModelTrainingMode, version: int, bucket_bytes: int
) -> dict:
    """Receive (scoring goes on), then pause scoring, reload, reset the prefix cache, bump the version, resume."""
    state: RewardServerState = app.state.reward
    sync: WeightSyncState = app.state.weight_sync
    engine = app.state.engine_client
    record: dict[str, Any] = {"version": version, "training_mode": mode.value, "num_params": len(specs)}
    t0 = time.monotonic()
    state.pending_update = version
    try:
        await _receive(engine, specs, bucket_bytes)
        t_received = time.monotonic()
        async with state.gate.updating_weights():
            # pause_generation minus its cosmetic 20 ms sleep: drain the engine, clear its caches
            await engine.engine_core.pause_scheduler_async(mode="wait", clear_cache=True)
            t_paused = time.monotonic()
            try:
                await engine.finish_weight_update(str(version))
                await engine.reset_prefix_cache()
                state.version = version
            finally:
                await engine.resume_generation()
        record.update(status="ok", receive_s=t_received - t0, pause_wait_s=t_paused - t_received,
                      reload_s=time.monotonic() - t_paused)
    except Exception as e:  # the old weights keep serving; the communicator is unusable
        logger.exception("weight update to version %d failed", version)
        record.update(status="failed", error=f"{type(e).__name__}: {e}", serving_version=state.version)
        try:
            await engine.shutdown_weight_transfer_engine()
        finally:
            sync.session = None
        state.last_failed_update = {**record, "at": time.time()}
    finally:
        state.pending_update = None
    record.update(total_s=time.monotonic() - t0, at=time.time())
    state.last_update = record
    return record


@router.post("/update_param_batch")
async def update_param_batch(request: Request):
    """Validate ``{metadata, training_mode, version, bucket_bytes}``, then receive and apply it."""
    sync: WeightSyncState = request.app.state.weight_sync
    state: RewardServerState = request.app.state.reward
    async with sync.control:
        try:
            payload = await _body(request)
            if sync.update_task is not None and not sync.update_task.done():
                raise RequestError("another weight update is in progress; wait for it to finish", 409)
            if sync.session is None:
                raise RequestError("no communicator: call /init_communicator before /update_param_batch", 409)
            specs, mode, version, bucket_bytes = _parse_update(payload, await _inventory(request), sync, state.version)
        except RequestError as e:
            return error_response(e.message, e.status)
        task = asyncio.create_task(_apply_update(request.app, specs, mode, version, bucket_bytes))
        sync.update_task = task

    async def stream() -> AsyncIterator[bytes]:
        yield (json.dumps({"status": "accepted", "version": version}) + "\n").encode()
        yield (json.dumps(await asyncio.shield(task)) + "\n").encode()

    return StreamingResponse(stream(), media_type="application/x-ndjson")


def install_weight_routes(
    app: FastAPI, transport: str, head_patterns: tuple[str, ...], max_update_bytes: int | None = None,
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S,
) -> None:
    app.state.weight_sync = WeightSyncState(transport, head_patterns, max_update_bytes, join_timeout_s)
    app.include_router(router)
