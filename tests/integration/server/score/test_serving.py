"""/score equals the same model in transformers (fp32) for text and token-id inputs."""

import math

import pytest

from verl_vllm_rm.parity.reference import sequence_scores

TOL = 1e-4


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_text_scores_match_transformers(rm_server, post_score, tokenizer, hf_model, texts, batch):
    inputs = texts[:batch]
    status, body = post_score(rm_server.url, {"input": inputs})
    assert status == 200, body
    ids = [tokenizer(t).input_ids for t in inputs]
    expected = sequence_scores(hf_model, ids)
    got = [d["score"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == list(range(batch))
    assert max(abs(a - b) for a, b in zip(got, expected)) < TOL
    assert body["usage"]["prompt_tokens"] == sum(map(len, ids))
    assert body["model"] == rm_server.args[rm_server.args.index("--model") + 1]


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_token_id_scores_match_transformers(rm_server, post_score, tokenizer, hf_model, texts, batch):
    ids = [tokenizer(t).input_ids for t in texts[-batch:]]
    status, body = post_score(rm_server.url, {"input": ids})
    assert status == 200, body
    expected = sequence_scores(hf_model, ids)
    got = [d["score"] for d in body["data"]]
    assert max(abs(a - b) for a, b in zip(got, expected)) < TOL
    assert body["usage"]["prompt_tokens"] == sum(map(len, ids))


def test_scores_differ_between_inputs(rm_server, post_score, texts):
    """Guards against a server that returns one constant for everything."""
    _, body = post_score(rm_server.url, {"input": texts[:16]})
    assert len({round(d["score"], 5) for d in body["data"]}) > 8


def test_normalize_applies_sigmoid(rm_server, post_score, texts):
    _, raw = post_score(rm_server.url, {"input": texts[:8]})
    _, norm = post_score(rm_server.url, {"input": texts[:8], "normalize": True})
    for r, n in zip(raw["data"], norm["data"]):
        assert n["score"] == pytest.approx(1.0 / (1.0 + math.exp(-r["score"])), abs=1e-6)


def test_shared_prefix_requests_keep_exact_scores(rm_server, post_score, tokenizer, hf_model):
    """A GRPO group: one prompt, many responses; prefix-cache reuse must not change scores."""
    prompt = tokenizer("What is 12 + 30? Please compute the sum and explain.").input_ids
    responses = [tokenizer(f" <think>add</think> The answer is {v}.").input_ids for v in range(40, 48)]
    ids = [prompt + r for r in responses]
    expected = sequence_scores(hf_model, ids)
    for _ in range(2):  # second pass hits the prefix cache
        _, body = post_score(rm_server.url, {"input": ids})
        assert max(abs(d["score"] - e) for d, e in zip(body["data"], expected)) < TOL
