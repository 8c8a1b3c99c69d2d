"""``/init_communicator``'s join, bounded in time and off the engine's loop.

The workers join on threads of their own (``init_weight_transfer_engine`` phase
``begin``); the server polls them with short engine calls, so scoring goes on
meanwhile, and takes the joined group (phase ``finish``). A join still under way
``JOIN_GRACE_S`` after its bound is abandoned on every worker (vLLM's
``shutdown_weight_transfer_engine``): no group is left half-joined, the old
weights keep serving, and the next ``/init_communicator`` starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

logger = logging.getLogger(__name__)
DEFAULT_JOIN_TIMEOUT_S = 30.0  # --weight-update-join-timeout
JOIN_POLL_S = 0.05
JOIN_GRACE_S = 1.0  # torch's own timeout error, when it comes, is more telling than ours


class JoinTimedOut(Exception):
    pass


def join_bound(requested_s: float, cap_s: float) -> float:
    """A request's ``timeout_s`` may shorten the server's ``--weight-update-join-timeout``, never lengthen it."""
    return min(requested_s, cap_s)


async def join_group(engine, info: dict[str, Any], bound_s: float) -> None:
    """Join every worker to the trainer's group within ``bound_s`` (+ grace), or raise and leave none joined."""
    init = {**info, "join_timeout_s": bound_s}
    deadline = time.monotonic() + bound_s + JOIN_GRACE_S
    try:
        await engine.init_weight_transfer_engine(WeightTransferInitRequest({**init, "phase": "begin"}))
        while not all(await engine.collective_rpc("rm_join_done")):
            if time.monotonic() >= deadline:
                raise JoinTimedOut(
                    f"the trainer's store at {info['master_address']}:{info['master_port']} did not complete the "
                    f"join within {bound_s:g} s (min of the request's timeout_s and --weight-update-join-timeout)"
                )
            await asyncio.sleep(JOIN_POLL_S)
        await engine.init_weight_transfer_engine(WeightTransferInitRequest({**init, "phase": "finish"}))
    except BaseException:
        try:  # abandon: no worker is left half-joined
            await asyncio.shield(engine.shutdown_weight_transfer_engine())
        except Exception:
            logger.exception("could not abandon a failed join")
        raise
