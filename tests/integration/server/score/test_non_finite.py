"""The server's own guard against non-finite scores: a model whose weights went NaN (a diverged trainer published
them) answers /score with a 500 naming the input, never a NaN a trainer would take for a reward, and keeps serving."""

from __future__ import annotations

import asyncio

import pytest
import requests
import torch
from sync_helpers import assert_parity, load_rm, reset_server

from verl_vllm_rm.client.reward_client import RewardServerError, VLLMRewardClient
from verl_vllm_rm.weight_sync import RewardModelPublisher

GUARD = "scoring failed on the server: RuntimeError: the model produced a non-finite score for input[0]: [nan]"


def failed_requests(url: str) -> int:
    return requests.get(f"{url}/health", timeout=10).json()["scoring"]["failed"]


def test_a_nan_head_gives_a_server_error_not_a_nan_score(ws_server, tiny_rm, probe_ids):
    url = ws_server.url
    version = reset_server(url, tiny_rm)
    diverged = load_rm(tiny_rm)
    with torch.no_grad():
        diverged.score.weight.fill_(float("nan"))
    try:
        with RewardModelPublisher(url, timeout_s=60) as pub:
            pub.publish(diverged, version + 1, "head_only")
        failed = failed_requests(url)
        resp = requests.post(f"{url}/score", json={"input": probe_ids[:1]}, timeout=60)
        assert resp.status_code == 500, resp.text
        assert resp.json()["error"]["message"] == GUARD
        assert failed_requests(url) == failed + 1

        client = VLLMRewardClient(url, max_retries=1, backoff_base_s=0.01, backoff_max_s=0.05)

        async def score() -> list[float]:
            try:
                return await client.score_batch(probe_ids[:1])
            finally:
                await client.close()

        with pytest.raises(RewardServerError, match=r"after 2 attempt\(s\).*HTTP 500: " + GUARD.replace("[", r"\[")):
            asyncio.run(score())  # a 5xx: retried, then an error, never a number
    finally:
        reset_server(url, tiny_rm)
    assert_parity(url, load_rm(tiny_rm), probe_ids)  # the server kept serving: good weights score again
