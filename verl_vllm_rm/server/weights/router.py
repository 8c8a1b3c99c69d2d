"""Weight-update routes (only with ``--enable-weight-updates``): the metadata plane.

``GET /weight_inventory``, ``POST /init_communicator``, ``POST /update_param_batch``,
``POST /commit_update``, ``POST /abort_update``, ``POST /close_communicator``. Tensors never
cross HTTP: they arrive over the process group opened by ``/init_communicator`` (see
``worker_extension``); ``apply.py`` receives and applies them.

``/update_param_batch`` answers in NDJSON: a refusal is a plain 4xx before any
tensor moves; an accepted update first sends ``{"status": "accepted"}`` (the
trainer's cue to start broadcasting), then one final line once the update has
been applied (or staged, with ``"commit": "deferred"``) or has failed. The update itself
runs as a task of its own, so a trainer that disconnects cannot cancel it halfway. A staged
update waits for ``/commit_update`` or ``/abort_update`` (``{"version": v}``); until then the
old weights serve and every other update or communicator change is refused (409).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from verl_vllm_rm.protocol.errors import RequestError
from verl_vllm_rm.protocol.inventory import Inventory, ParamSpec, WeightUpdateRefused
from verl_vllm_rm.protocol.lora import LoraBases
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.json_body import is_int, parse_json, preview
from verl_vllm_rm.server.state import RewardServerState, error_response, read_body
from verl_vllm_rm.server.weights.apply import abort_update, apply_update, commit_update
from verl_vllm_rm.server.weights.join import JoinTimedOut, join_bound, join_group
from verl_vllm_rm.server.weights.state import DEFAULT_JOIN_TIMEOUT_S, DEFAULT_STALL_TIMEOUT_S, WeightSyncState

WEIGHT_ROUTES = ("/weight_inventory", "/init_communicator", "/update_param_batch", "/commit_update", "/abort_update",
                 "/close_communicator")
COMMIT_MODES = ("now", "deferred")
CAPTURE_POLL_S = (0.05, 2.0)  # the first and the longest wait between polls of the LoRA base store's copy


router = APIRouter()
logger = logging.getLogger(__name__)


async def _inventory(request: Request) -> Inventory:
    """The inventory, read from the engine once. Every rank of a sharded trainer asks a fresh server at the same
    moment; concurrent engine reads of it were seen to hang one of them (a publish timed out on a healthy server),
    so the first read is the only one and the others wait for it."""
    sync: WeightSyncState = request.app.state.reward.weights
    async with sync.inventory_lock:
        if sync.inventory is None:
            results = await request.app.state.engine_client.collective_rpc(
                "rm_weight_inventory", args=(sync.lora_bases, sync.lora_bases_max_bytes, sync.head_patterns))
            bases = _fleet_bases([r["lora_bases"] for r in results])
            sync.inventory = Inventory.from_json({**results[0], "lora_bases": bases})
            sync.nccl_version = results[0]["nccl_version"]
    return sync.inventory


def _fleet_bases(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """A store is usable only when every worker holds its own: the first report that does not, else the first
    (logged when it leaves LoRA publishes to merged weights)."""
    bases = next((r for r in reports if r["state"] != "held"), reports[0])
    if bases["state"] == "unavailable":
        logger.warning("LoRA publishes will send merged weights: %s", bases["reason"])
    return bases


async def _capture_lora_bases(request: Request, inventory: Inventory) -> None:
    """Copy the workers' planned LoRA base stores (the first update that carries adapters); refuses the update,
    before any tensor moves, when a worker could not, and from then on the inventory says ``unavailable``. The
    copies run on the workers' own threads, polled with short engine calls: scoring goes on meanwhile."""
    engine = request.app.state.engine_client
    await engine.collective_rpc("rm_begin_lora_capture")
    wait_s = CAPTURE_POLL_S[0]
    while not all(await engine.collective_rpc("rm_lora_capture_done")):
        await asyncio.sleep(wait_s)
        wait_s = min(2 * wait_s, CAPTURE_POLL_S[1])  # past vLLM's 1 s busy loop of a worker after each call
    results = await engine.collective_rpc("rm_finish_lora_capture")
    bases = LoraBases.from_json(_fleet_bases(results))
    inventory.set_lora_bases(bases)
    if bases.state != "held":
        raise RequestError(f"the server could not hold its LoRA bases: {bases.reason}; nothing was sent and the old "
                           "weights serve: publish merged weights (the publisher's lora_wire auto does so by itself)",
                           409)


async def _body(request: Request) -> dict[str, Any]:
    payload = parse_json(await read_body(request, request.app.state.reward.max_request_bytes))
    if not isinstance(payload, dict):
        raise RequestError("request body must be a JSON object")
    return payload


@router.get("/weight_inventory")
async def weight_inventory(request: Request) -> JSONResponse:
    sync: WeightSyncState = request.app.state.reward.weights
    state: RewardServerState = request.app.state.reward
    body = (await _inventory(request)).to_json()
    body.update(
        max_update_bytes=sync.max_update_bytes,
        transport=sync.transport,
        nccl_version=sync.nccl_version,
        head_patterns=list(sync.head_patterns),
        stall_timeout_s=sync.stall_timeout_s,
        world_size=state.world_size,
        version=sync.version,
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
    sync: WeightSyncState = request.app.state.reward.weights
    state: RewardServerState = request.app.state.reward
    try:
        info = _parse_init(await _body(request), 1 + state.world_size)
    except RequestError as e:
        return error_response(e.message, e.status)
    async with sync.control:
        if (busy := sync.busy()) is not None:
            return error_response(busy, 409)
        sync.session = None
        bound = join_bound(info["timeout_s"], sync.join_timeout_s)
        info["timeout_s"] = min(info["timeout_s"], sync.stall_timeout_s)  # each wait of a transfer: a stall's bound
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
    sync: WeightSyncState = request.app.state.reward.weights
    async with sync.control:
        if (busy := sync.busy()) is not None:
            return error_response(busy, 409)
        await request.app.state.engine_client.shutdown_weight_transfer_engine()
        sync.session = None
    return JSONResponse({"status": "closed"})


def _parse_lora(lora: Any) -> dict[str, float]:
    """The per-module scalings of ``"lora": {"scaling": {module: float}}``; range checks follow in check_update."""
    if not isinstance(lora, dict) or set(lora) != {"scaling"}:
        raise RequestError(f"'lora' must be {{\"scaling\": {{module: number}}}}, got {preview(lora)}")
    scaling = lora["scaling"]
    if not isinstance(scaling, dict) or not scaling or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in scaling.values()):
        raise RequestError(f"'lora.scaling' must be a non-empty object of module name to number, got "
                           f"{preview(scaling)}")
    return {k: float(v) for k, v in scaling.items()}


def _parse_update(payload: dict[str, Any], inventory: Inventory, sync: WeightSyncState, version: int):
    unknown = sorted(set(payload) - {"metadata", "training_mode", "version", "bucket_bytes", "commit", "lora"})
    if unknown:
        raise RequestError(f"unknown field(s) {unknown}; send metadata, training_mode, version, bucket_bytes "
                           "and optionally commit and lora")
    commit = payload.get("commit", "now")
    if commit not in COMMIT_MODES:
        raise RequestError(f"'commit' must be one of {list(COMMIT_MODES)}, got {preview(commit)}")
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
    scaling = _parse_lora(payload["lora"]) if "lora" in payload else None
    try:
        mode = RewardModelTrainingMode.parse(payload.get("training_mode"))
        specs = [ParamSpec.from_json(p) for p in payload["metadata"]]
        inventory.check_update(specs, mode, sync.head_patterns, max_bytes=sync.max_update_bytes, scaling=scaling)
    except (ValueError, WeightUpdateRefused) as e:
        raise RequestError(str(e)) from None
    if sync.lost is not None and (mode is not RewardModelTrainingMode.FULL or {s.name for s in specs} != inventory.names):
        raise RequestError(f"{sync.lost_message()}; this update (training_mode {mode.value}, {len(specs)} of "
                           f"{len(inventory.names)} weights) would leave the rest unknown: publish every weight", 409)
    return specs, mode, new_version, bucket_bytes, commit == "deferred", scaling


@router.post("/update_param_batch")
async def update_param_batch(request: Request):
    """Validate ``{metadata, training_mode, version, bucket_bytes, commit?, lora?}``, then receive and apply (or stage) it."""
    sync: WeightSyncState = request.app.state.reward.weights
    async with sync.control:
        try:
            payload = await _body(request)
            if (busy := sync.busy()) is not None:
                raise RequestError(busy, 409)
            if sync.session is None:
                raise RequestError("no communicator: call /init_communicator before /update_param_batch", 409)
            inventory = await _inventory(request)
            specs, mode, version, bucket_bytes, deferred, scaling = _parse_update(payload, inventory, sync,
                                                                                  sync.version)
            if scaling and not inventory.lora_bases.captured:
                await _capture_lora_bases(request, inventory)
        except RequestError as e:
            return error_response(e.message, e.status)
        task = asyncio.create_task(apply_update(request.app, specs, mode, version, bucket_bytes, deferred,
                                                scaling))
        sync.update_task = task

    async def stream() -> AsyncIterator[bytes]:
        yield (json.dumps({"status": "accepted", "version": version}) + "\n").encode()
        yield (json.dumps(await asyncio.shield(task)) + "\n").encode()

    return StreamingResponse(stream(), media_type="application/x-ndjson")


async def _staged_version(request: Request) -> int:
    """The ``version`` the request names, which must be the staged one."""
    sync: WeightSyncState = request.app.state.reward.weights
    staged = sync.staged_update
    version = (await _body(request)).get("version")
    if staged is None:
        dropped = sync.last_failed_update
        if dropped.get("version") == version and dropped.get("status") == "aborted" and dropped.get("error"):
            raise RequestError(f"no update is staged (asked for version {version}): {dropped['error']}; the old "
                               "weights serve: publish it again (stage and commit within the stall timeout)", 409)
        raise RequestError(f"no update is staged (asked for version {preview(version)}); stage one with "
                           "/update_param_batch and \"commit\": \"deferred\"", 409)
    if not is_int(version) or version != staged["version"]:
        raise RequestError(f"'version' must be the staged version {staged['version']}, got {preview(version)}", 409)
    return version


async def _second_phase(request: Request, action) -> JSONResponse:
    """Commit or abort the staged update the request names."""
    sync: WeightSyncState = request.app.state.reward.weights
    async with sync.control:
        try:
            await _staged_version(request)
        except RequestError as e:
            return error_response(e.message, e.status)
        record = await action(request.app)
    return JSONResponse(record, status_code=500 if record["status"] == "failed" else 200)


@router.post("/commit_update")
async def commit_staged(request: Request) -> JSONResponse:
    """Apply the staged update ``{"version": v}``: pause scoring, reload, reset the prefix cache, bump, resume."""
    return await _second_phase(request, commit_update)


@router.post("/abort_update")
async def abort_staged(request: Request) -> JSONResponse:
    """Drop the staged update ``{"version": v}``; the serving weights never changed."""
    return await _second_phase(request, abort_update)


def install_weight_routes(
    app: FastAPI, transport: str, head_patterns: tuple[str, ...], max_update_bytes: int | None = None,
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S, lora_bases: str = "host", lora_bases_max_bytes: int | None = None,
    rollback_max_bytes: int | None = None, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
) -> None:
    sync: WeightSyncState = app.state.reward.weights
    sync.stall_timeout_s = stall_timeout_s
    sync.lora_bases, sync.lora_bases_max_bytes = lora_bases, lora_bases_max_bytes
    sync.rollback_max_bytes = rollback_max_bytes
    sync.transport, sync.head_patterns = transport, head_patterns
    sync.max_update_bytes, sync.join_timeout_s = max_update_bytes, join_timeout_s
    app.include_router(router)
