"""The examples of docs/development.md run, against the session's real server and tiny RM (no server of their own)."""

import asyncio
import math

import pytest
from sync_helpers import reset_server

from verl_vllm_rm.parity.reference import sequence_scores


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_score_with_client(rm_server, load_example, tokenizer, hf_model):
    """The example's raw scores are the tiny RM's in transformers; normalized ones their sigmoid."""
    example = load_example("score_with_client")
    raw, normalized, version = asyncio.run(example.score(rm_server.url))
    expected = sequence_scores(hf_model, [tokenizer(t).input_ids for t in example.TEXTS])
    assert raw == pytest.approx(expected, abs=1e-4)
    assert normalized == pytest.approx([sigmoid(s) for s in expected], abs=1e-5)
    assert version == 0


def test_pairwise_validation(rm_server, tiny_rm, load_example, tokenizer, hf_model):
    """win / win_and / ref_margin against transformers' scores of each response and of the reference,
    each after the prompt (not the manager's own rm_score)."""
    example = load_example("pairwise_validation")
    info = example.validate(rm_server.url, tiny_rm)
    prompt = tokenizer("What is 3 + 4?").input_ids
    responses = [prompt + tokenizer(r, add_special_tokens=False).input_ids for r in example.RESPONSES]
    reference = prompt + tokenizer(example.REFERENCE, add_special_tokens=False).input_ids
    *scores, ref = sequence_scores(hf_model, [*responses, reference])
    margins = [s - ref for s in scores]
    assert info["ref_margin"] == pytest.approx(margins, abs=1e-4)
    assert margins[0] == 0.0 and all(abs(m) > 1e-3 for m in margins[1:])  # one exact tie, no near-tie
    assert info["win"] == [float(m > 0) for m in margins]
    assert info["win_and"] == [float(m >= 0) for m in margins]
    assert info["win"][0] == 0.0 and info["win_and"][0] == 1.0, "the reference ties with itself"


def test_custom_rule_reward(rm_server, tiny_rm, load_example, tokenizer, hf_model):
    """total = 0.8 * rubric + 0.5 * politeness + format, with the rubric from transformers and the rule
    values written out."""
    example = load_example("custom_rule_reward")
    info = example.score(rm_server.url, tiny_rm)
    polite, fmt = [1.0, 0.0, 1.0], [1.0, 0.0, 0.0]  # "thanks", none, "please"; only the first has both blocks
    assert info["verifiable_score"] == polite, "my_rule.politeness"
    assert info["format"] == fmt
    prompt = tokenizer("What is 3 + 4?").input_ids
    rubric = sequence_scores(hf_model, [prompt + tokenizer(r, add_special_tokens=False).input_ids
                                        for r in example.RESPONSES])
    assert info["rm_score"] == pytest.approx(rubric, abs=1e-4)
    assert example.WEIGHTS == {"rubric": 0.8, "verifiable": 0.5, "format": 1.0}
    want = [0.8 * r + 0.5 * p + 1.0 * f for r, p, f in zip(rubric, polite, fmt)]
    assert info["score"] == pytest.approx(want, abs=1e-4)


MODES = ["head_only", "lora", "full"]


def test_train_and_publish_example(ws_server, tiny_rm, load_example, hf_model, probe_ids):
    """The example's parity records (server vs its trained model) hold, and independently of them the
    server no longer scores like the initial RM: training and publishing did change what it serves."""
    from sync_helpers import max_diff, server_scores

    start = reset_server(ws_server.url, tiny_rm)
    records = load_example("train_and_publish").train_and_publish(ws_server.url, tiny_rm, MODES, steps=2)
    assert [r["mode"] for r in records] == [m for m in MODES for _ in range(2)]
    assert [r["version"] for r in records] == list(range(start + 1, start + 7))
    assert max(r["max_diff"] for r in records) < 1e-4
    assert max_diff(server_scores(ws_server.url, probe_ids), sequence_scores(hf_model, probe_ids)) > 1e-3
