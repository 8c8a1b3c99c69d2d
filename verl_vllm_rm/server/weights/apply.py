"""One weight update on the server: receive (scoring goes on), then apply, at once or when committed.

An update received with ``commit: "now"`` is applied as soon as the tensors are in: pause
scoring, reload, reset the prefix cache, bump the version, resume. With ``commit:
"deferred"`` (the first phase of a two-phase commit over several replicas) the received
tensors stay staged in the workers (vLLM's weight-update session stays open) and the old
weights keep serving until ``commit`` applies them or ``abort`` drops them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import FastAPI
from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

from verl_vllm_rm.protocol.inventory import ParamSpec
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.wire import TransferStalled
from verl_vllm_rm.server.weights.state import WeightSyncState
from verl_vllm_rm.server.weights.worker_extension import ABORT_PHASE

logger = logging.getLogger(__name__)

RECEIVE_POLL_S = 0.005  # the wait between polls; with several workers it doubles, up to RECEIVE_POLL_MAX_S
# With several workers (tensor parallelism) a poll is a ``collective_rpc`` through vLLM's message queue, after which
# each worker busy-loops for 1 s, on the cores its receive needs (vLLM-CPU binds a worker to its cores). Polls
# every few ms kept them spinning for the whole transfer and starved it (a 406 MB update into a TP 2 CPU server
# timed out); backing off past the busy loop lets them sleep while the buckets arrive. One worker is called
# in-process: no busy loop, no back-off.
RECEIVE_POLL_MAX_S = 2.0  # longer than the busy loop (vLLM's MessageQueue busy_loop_s = 1 s)
RECEIVE_STALL_GRACE_S = 5.0  # the workers' own bounded waits end first, with the more telling error


async def _receive(engine, specs: list[ParamSpec], bucket_bytes: int, workers: int, stall_s: float,
                   lora_scaling: dict[str, float] | None = None, rollback_max_bytes: int | None = None
                   ) -> dict[str, int]:
    """Start the workers' background receive and wait for it without blocking the engine; returns the most
    bytes a worker holds for updates on its device and on the host.

    A long ``collective_rpc`` would hold the engine's loop (and every score) for the
    whole transfer; short polls let scoring go on with the old weights meanwhile.
    The final ``join`` raises the receive's error through vLLM's own lifecycle, which
    then clears its update state. Each worker's wait for a bucket ends by itself after
    the group's timeout (at most ``stall_s``); should a receive neither end nor move for
    ``stall_s`` plus a grace, the update fails here all the same.
    """
    await engine.start_weight_update()
    info = {"params": [s.to_json() for s in specs], "bucket_bytes": bucket_bytes, "lora_scaling": lora_scaling,
            "rollback_max_bytes": rollback_max_bytes}
    await engine.update_weights(WeightTransferUpdateRequest({**info, "phase": "begin"}))
    wait_s, received, moved_at = RECEIVE_POLL_S, -1, time.monotonic()
    while True:
        progress = await engine.collective_rpc("rm_receive_progress")
        if all(done for done, _ in progress):
            break
        if (buckets := sum(count for _, count in progress)) != received:
            received, moved_at = buckets, time.monotonic()
        elif time.monotonic() - moved_at > stall_s + RECEIVE_STALL_GRACE_S:
            await engine.collective_rpc("rm_close_failed_reload")  # no reload began: closes vLLM's update session
            # a backstop: each worker's wait for a bucket ends first (the group's timeout is at most stall_s)
            # internal: only a receive thread stuck outside its bounded waits reaches it, no fault a test can make
            raise TransferStalled(f"the workers received no bucket for {stall_s:g} s (--weight-update-stall-"
                                  "timeout) and their receive did not end")
        await asyncio.sleep(wait_s)
        wait_s = min(2 * wait_s, RECEIVE_POLL_MAX_S) if workers > 1 else wait_s
    await engine.update_weights(WeightTransferUpdateRequest({**info, "phase": "join"}))
    held = await engine.collective_rpc("rm_receive_memory")
    return {"receive_device_bytes": max(h["device_bytes"] for h in held),
            "staged_host_bytes": max(h["host_bytes"] for h in held)}


async def _drop_session(app: FastAPI, record: dict[str, Any], error: BaseException) -> None:
    """After a failed receive or reload: the old weights keep serving (or, a reload that could not be undone,
    are lost: ``serving_version`` None); the communicator is unusable."""
    state: WeightSyncState = app.state.reward.weights
    record.update(status="failed", error=f"{type(error).__name__}: {error}", serving_version=state.serving_version)
    try:
        await app.state.engine_client.shutdown_weight_transfer_engine()
    finally:
        app.state.reward.weights.session = None
    state.last_failed_update = {**record, "at": time.time()}


async def apply_update(app: FastAPI, specs: list[ParamSpec], mode: RewardModelTrainingMode, version: int,
                       bucket_bytes: int, deferred: bool,
                       lora_scaling: dict[str, float] | None = None) -> dict[str, Any]:
    """Receive the update, then apply it (or, ``deferred``, keep it staged); the record of what happened.

    ``lora_scaling`` (an update carrying LoRA adapters) makes the workers merge them into their base store.
    """
    state: WeightSyncState = app.state.reward.weights
    record: dict[str, Any] = {"version": version, "training_mode": mode.value, "num_params": len(specs),
                              "lora_adapters": bool(lora_scaling)}
    t0 = time.monotonic()
    state.pending_update = version
    try:
        record.update(await _receive(app.state.engine_client, specs, bucket_bytes, app.state.reward.world_size,
                                     state.stall_timeout_s, lora_scaling, state.rollback_max_bytes))
        record["receive_s"] = time.monotonic() - t0
        if deferred:
            state.staged_update = record
            record["status"] = "staged"
            state.staged_expiry = asyncio.create_task(_drop_when_not_committed(app, record))
        else:
            await _reload(app, version, record)
    except Exception as e:
        logger.exception("weight update to version %d failed", version)
        await _drop_session(app, record, e)
    finally:
        state.pending_update = None
    record.update(total_s=time.monotonic() - t0, at=time.time())
    if record["status"] != "staged":
        state.last_update = record
    return record


async def _drop_when_not_committed(app: FastAPI, staged: dict[str, Any]) -> None:
    """Abort ``staged`` when neither ``/commit_update`` nor ``/abort_update`` came within the stall timeout: the
    trainer that staged it is gone (a staged update refuses every other update, so it would block the next trainer
    for ever). A slow trainer's late commit is then refused naming this."""
    state: WeightSyncState = app.state.reward.weights
    await asyncio.sleep(state.stall_timeout_s)
    async with state.control:
        if state.staged_update is staged:
            logger.warning("staged weight version %d dropped: not committed within --weight-update-stall-timeout "
                           "%g s", staged["version"], state.stall_timeout_s)
            await abort_update(app, f"version {staged['version']} was staged and neither committed nor aborted "
                                    f"within {state.stall_timeout_s:g} s (--weight-update-stall-timeout): dropped")


def _end_staging(state: WeightSyncState) -> dict[str, Any]:
    """Take the staged update out of the state (its expiry no longer applies); a copy of its record."""
    record, state.staged_update = dict(state.staged_update), None
    expiry, state.staged_expiry = state.staged_expiry, None
    if expiry is not None and expiry is not asyncio.current_task():
        expiry.cancel()
    return record


async def commit_update(app: FastAPI) -> dict[str, Any]:
    """Apply the staged update (the caller checked there is one)."""
    state: WeightSyncState = app.state.reward.weights
    record = _end_staging(state)
    t0 = time.monotonic()
    try:
        await _reload(app, record["version"], record)
    except Exception as e:
        logger.exception("committing weight version %d failed", record["version"])
        await _drop_session(app, record, e)
    record.update(commit_s=time.monotonic() - t0, at=time.time())
    state.last_update = record
    return record


async def abort_update(app: FastAPI, reason: str | None = None) -> dict[str, Any]:
    """Drop the staged update; the serving weights never changed (the caller checked there is one). ``reason``:
    why the server dropped it by itself (else the trainer asked)."""
    state: WeightSyncState = app.state.reward.weights
    record = _end_staging(state)
    try:  # the worker extension drops its buffers and raises: vLLM then closes the update session
        await app.state.engine_client.update_weights(WeightTransferUpdateRequest({"phase": ABORT_PHASE}))
    except Exception as e:
        if "update aborted" not in str(e):
            raise
    record.update(status="aborted", serving_version=state.version, at=time.time())
    if reason is not None:
        record["error"] = reason
    state.last_failed_update = record
    return record


async def _reload(app: FastAPI, version: int, record: dict[str, Any]) -> None:
    """Pause scoring, load the received weights, reset the prefix cache, bump the version, resume."""
    state: WeightSyncState = app.state.reward.weights
    engine = app.state.engine_client
    t0 = time.monotonic()
    async with state.gate.updating_weights():
        # pause_generation minus its cosmetic 20 ms sleep: drain the engine, clear its caches
        await engine.engine_core.pause_scheduler_async(mode="wait", clear_cache=True)
        t_paused = time.monotonic()
        try:
            try:
                await engine.finish_weight_update(str(version))
            except BaseException:
                await _close_failed_reload(engine, state)
                raise
            await engine.reset_prefix_cache()
            state.version, state.lost = version, None
        finally:
            await engine.resume_generation()
    record.update(status="ok", pause_wait_s=t_paused - t0, reload_s=time.monotonic() - t_paused)
    # the most a worker's rollback copies held during the reload: host memory (on a CPU worker, its RSS)
    record["rollback_host_bytes"] = max(await engine.collective_rpc("rm_rollback_memory"))


async def _close_failed_reload(engine, state: WeightSyncState) -> None:
    """vLLM keeps its update session open when the reload raises (every later update would be refused as
    already active, and dropping the session would raise): each worker closes it and says whether it restored
    the touched modules exactly (``server/weights/rollback.py``). One that could not leaves the weights lost."""
    lost = [why for why in await engine.collective_rpc("rm_close_failed_reload") if why is not None]
    if lost:
        state.lost = lost[0]
        logger.error("the weights of this server are lost: %s", state.lost)
