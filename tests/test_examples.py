"""The README's examples run, against the session's real server and tiny RM (no server of their own)."""

import asyncio
import math

import pytest
from sync_helpers import reset_server

MODES = ["head_only", "lora", "full"]


def test_score_with_client(rm_server, load_example):
    raw, normalized, version = asyncio.run(load_example("score_with_client").score(rm_server.url))
    assert len(raw) == 3 and version == 0
    assert normalized == pytest.approx([1 / (1 + math.exp(-s)) for s in raw], abs=1e-5)


def test_pairwise_validation(rm_server, tiny_rm, load_example):
    info = load_example("pairwise_validation").validate(rm_server.url, tiny_rm)
    assert info["win"][0] == 0.0 and info["win_and"][0] == 1.0, "the reference ties with itself"
    assert info["ref_margin"][0] == pytest.approx(0.0, abs=1e-6)
    for win, win_and, margin in zip(info["win"], info["win_and"], info["ref_margin"]):
        assert win == float(margin > 0) and win_and == float(margin >= 0)


def test_custom_rule_reward(rm_server, tiny_rm, load_example):
    example = load_example("custom_rule_reward")
    info = example.score(rm_server.url, tiny_rm)
    assert info["verifiable_score"] == [1.0, 0.0, 1.0], "my_rule.politeness"
    assert info["format"] == [1.0, 0.0, 0.0]
    w = example.WEIGHTS
    for total, rubric, polite, fmt in zip(info["score"], info["rm_score"], info["verifiable_score"], info["format"]):
        assert total == pytest.approx(w["rubric"] * rubric + w["verifiable"] * polite + w["format"] * fmt, abs=1e-6)


MODES = ["head_only", "lora", "full"]


def test_train_and_publish_example(ws_server, tiny_rm, load_example):
    start = reset_server(ws_server.url, tiny_rm)
    records = load_example("train_and_publish").train_and_publish(ws_server.url, tiny_rm, MODES, steps=2)
    assert [r["mode"] for r in records] == [m for m in MODES for _ in range(2)]
    assert [r["version"] for r in records] == list(range(start + 1, start + 7))
    assert max(r["max_diff"] for r in records) < 1e-4
