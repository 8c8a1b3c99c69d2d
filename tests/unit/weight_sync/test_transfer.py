"""The trainer's side of a transfer (``weight_sync.transfer``) without a server: which HTTP errors are refusals,
the address a server reaches the trainer at, and the count of gathered bytes alive at once."""

from __future__ import annotations

import pytest
import torch

from verl_vllm_rm.client.http import HttpError
from verl_vllm_rm.weight_sync.transfer import _LiveBytes, is_refusal, local_address_towards


@pytest.mark.parametrize("status, refusal", [(400, True), (409, True), (413, True), (499, True), (500, False),
                                             (503, False), (None, False)])
def test_a_4xx_is_a_refusal_and_a_5xx_or_no_answer_is_not(status, refusal):
    assert is_refusal(HttpError("http://rm", "why", status)) is refusal


@pytest.mark.parametrize("url", ["http://localhost:8001", "http://127.0.0.1:8001", "http://[::1]:8001",
                                 "not a url", "http://127.0.0.2:9"])
def test_a_server_on_this_host_reaches_the_trainer_on_loopback(url):
    assert local_address_towards(url) == "127.0.0.1"


def test_gathered_bytes_are_counted_while_alive_and_the_peak_is_kept():
    live = _LiveBytes()
    model_own = torch.ones(1000)
    assert live.track(model_own, new=False) is model_own and (live.now, live.peak) == (0, 0)
    a = live.track(torch.ones(10), new=True)  # 40 bytes
    b = live.track(torch.ones(4, dtype=torch.float64), new=True)  # 32 bytes
    assert (live.now, live.peak) == (72, 72)
    del a
    assert (live.now, live.peak) == (32, 72)
    c = live.track(torch.ones(2, dtype=torch.int8), new=True)
    assert (live.now, live.peak) == (34, 72)
    del b, c
    assert (live.now, live.peak) == (0, 72)
