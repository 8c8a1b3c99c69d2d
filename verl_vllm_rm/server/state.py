"""What every route shares: the server's state, the bounded body read and the error answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import JSONResponse

from verl_vllm_rm.protocol.errors import RequestError, error_body
from verl_vllm_rm.protocol.model_shape import ModelShape
from verl_vllm_rm.server.engine_watch import EngineWatch
from verl_vllm_rm.server.weights.state import WeightSyncState


@dataclass
class ScoreCounters:
    """What this server process has scored: ``/score`` requests answered, their inputs, the ones refused (4xx)
    and failed (5xx), and the time spent in them (``/health`` reports it: per-replica metrics)."""

    requests: int = 0
    inputs: int = 0
    refused: int = 0
    failed: int = 0
    busy_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"requests": self.requests, "inputs": self.inputs, "refused": self.refused, "failed": self.failed,
                "busy_s": round(self.busy_s, 6)}


@dataclass
class RewardServerState:
    """What the reward routes need besides the engine; lives in ``app.state.reward``."""

    kind: str  # "reward_model", or "judge" (--runner generate: no /score, vLLM's chat route answers)
    shape: ModelShape | None  # the served reward head (None for a judge)
    served_models: list[str]
    max_model_len: int
    vocab_size: int
    world_size: int
    step_tag: tuple[int, str] | None  # (id, text) of the step tag a process reward is read at
    reward_token: tuple[int, str] | None  # (id, token) appended to every input that does not end with it
    max_score_batch: int
    max_request_bytes: int
    weights: WeightSyncState = field(default_factory=WeightSyncState)
    scoring: ScoreCounters = field(default_factory=ScoreCounters)
    engine_watch: EngineWatch | None = None  # a reward model's (--engine-stall-timeout); None for a judge


def error_response(message: str, status: int) -> JSONResponse:
    return JSONResponse(error_body(message, status), status_code=status)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) once it passes ``limit`` bytes.

    A declared ``Content-Length`` is checked before reading; a chunked body has
    none, so the stream is counted and dropped at the limit, not read whole.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"request body of {declared} bytes exceeds --max-request-bytes {limit}", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"request body of more than {limit} bytes exceeds --max-request-bytes {limit}", 413)
        chunks.append(chunk)
    return b"".join(chunks)
