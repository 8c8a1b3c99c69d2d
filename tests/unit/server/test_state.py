"""What every route shares (``server.state``), in process: the counters ``/health`` reports, the error answer and the
bounded read of a request body (413 past ``--max-request-bytes``, before a declared body is read at all)."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request

from verl_vllm_rm.protocol.errors import RequestError
from verl_vllm_rm.server.state import RewardServerState, ScoreCounters, error_response, read_body
from verl_vllm_rm.server.weights.state import WeightSyncState


def request(chunks: list[bytes], content_length: str | None = None) -> tuple[Request, list[int]]:
    """A request whose body arrives in ``chunks``; also the list of chunk indices the server asked for."""
    asked: list[int] = []

    async def receive():
        asked.append(len(asked))
        i = len(asked) - 1
        return {"type": "http.request", "body": chunks[i], "more_body": i < len(chunks) - 1}

    headers = [] if content_length is None else [(b"content-length", content_length.encode())]
    return Request({"type": "http", "method": "POST", "path": "/score", "headers": headers}, receive), asked


def read(chunks: list[bytes], limit: int, content_length: str | None = None) -> tuple[bytes, list[int]]:
    req, asked = request(chunks, content_length)
    return asyncio.run(read_body(req, limit)), asked


def test_a_body_within_the_limit_is_read_whole():
    assert read([b"ab", b"", b"cde"], 5) == (b"abcde", [0, 1, 2])
    assert read([b"abc"], 3, content_length="3") == (b"abc", [0])
    assert read([b""], 0) == (b"", [0])


def test_a_declared_length_over_the_limit_is_refused_before_reading():
    req, asked = request([b"x" * 11], content_length="11")
    with pytest.raises(RequestError, match=r"^request body of 11 bytes exceeds --max-request-bytes 10$") as err:
        asyncio.run(read_body(req, 10))
    assert err.value.status == 413 and asked == []


@pytest.mark.parametrize("content_length", [None, "2", "junk"], ids=["chunked", "understated", "not a number"])
def test_a_body_that_grows_past_the_limit_is_refused_without_reading_the_rest(content_length):
    req, asked = request([b"1234", b"5678", b"9", b"never read"], content_length)
    with pytest.raises(RequestError, match=r"^request body of more than 8 bytes exceeds --max-request-bytes 8$") as err:
        asyncio.run(read_body(req, 8))
    assert err.value.status == 413 and asked == [0, 1, 2]


def test_an_error_answer_is_the_openai_shaped_body_with_its_status():
    response = error_response("model 'x' is not served here", 404)
    assert response.status_code == 404
    assert json.loads(response.body) == {"error": {"message": "model 'x' is not served here", "type": "NotFoundError",
                                                   "code": 404}}
    assert json.loads(error_response("engine died", 503).body)["error"]["type"] == "ServerError"


def test_the_score_counters_report_rounded_busy_time():
    counters = ScoreCounters(requests=3, inputs=12, refused=1, failed=0, busy_s=0.123456789)
    assert counters.as_dict() == {"requests": 3, "inputs": 12, "refused": 1, "failed": 0, "busy_s": 0.123457}
    assert ScoreCounters().as_dict() == {"requests": 0, "inputs": 0, "refused": 0, "failed": 0, "busy_s": 0.0}


def test_each_server_state_has_its_own_counters_and_weight_sync_state():
    def state() -> RewardServerState:
        return RewardServerState("judge", None, ["judge"], 512, 1000, 1, None, None, 8, 1 << 20)

    one, two = state(), state()
    assert isinstance(one.weights, WeightSyncState) and one.weights is not two.weights
    one.scoring.requests += 1
    assert two.scoring.requests == 0 and one.engine_watch is None
