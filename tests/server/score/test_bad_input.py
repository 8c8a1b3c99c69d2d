"""Bad /score input gets a 4xx JSON error naming the problem; the server stays healthy."""

import pytest
import requests

from verl_vllm_rm.parity.reference import sequence_scores

BAD_REQUESTS = [
    ("empty input", {"input": []}, 400, "non-empty list"),
    ("missing input", {"normalize": True}, 400, "missing field 'input'"),
    ("input not a list", {"input": "hello"}, 400, "non-empty list"),
    ("numbers", {"input": [1, 2, 3]}, 400, "unsupported item types ['int']"),
    ("dicts", {"input": [{"text": "a"}]}, 400, "unsupported item types ['dict']"),
    ("mixed str and ids", {"input": ["a", [1, 2]]}, 400, "mixes"),
    ("empty token list", {"input": [[]]}, 400, "input[0] is an empty token-id list"),
    ("float token ids", {"input": [[1, 2.5]]}, 400, "input[0] must contain only integer token ids"),
    ("bool token ids", {"input": [[True, 2]]}, 400, "input[0] must contain only integer token ids"),
    ("id outside vocab", {"input": [[5, 100000]]}, 400, "token id 100000 outside the vocabulary"),
    ("negative id", {"input": [[5, -1]]}, 400, "token id -1 outside the vocabulary"),
    ("overlong ids", {"input": [[5] * 600]}, 400, "600 tokens, longer than max_model_len=512"),
    ("overlong text", {"input": ["ok", "the answer is " * 300]}, 400, "input[1] has"),
    ("unknown model", {"input": ["a"], "model": "gpt-9"}, 404, "model 'gpt-9' is not served here"),
    ("unknown field", {"input": ["a"], "temperature": 1}, 400, "unknown field(s) ['temperature']"),
    ("normalize not bool", {"input": ["a"], "normalize": "yes"}, 400, "'normalize' must be true or false"),
    ("json array body", ["a"], 400, "must be a JSON object"),
    ("too many inputs", {"input": ["a"] * 4097}, 413, "more than this server's --max-score-batch 4096"),
]


@pytest.mark.parametrize("name,payload,status,needle", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_is_a_clear_4xx(rm_server, post_score, name, payload, status, needle):
    got_status, body = post_score(rm_server.url, payload)
    assert got_status == status, body
    assert needle in body["error"]["message"]
    assert body["error"]["code"] == status


@pytest.mark.parametrize("raw", [b"{bad json", b"", b"\xff\xfe", b"null"])
def test_invalid_json_body(rm_server, post_score, raw):
    status, body = post_score(rm_server.url, data=raw, headers={"content-type": "application/json"})
    assert status == 400
    assert "JSON" in body["error"]["message"]


def test_server_still_healthy_and_correct_after_bad_input(rm_server, post_score, tokenizer, hf_model, texts):
    for _, payload, _, _ in BAD_REQUESTS:
        post_score(rm_server.url, payload)
    health = requests.get(f"{rm_server.url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["type"] == "reward_model"
    status, body = post_score(rm_server.url, {"input": texts[:4]})
    assert status == 200
    expected = sequence_scores(hf_model, [tokenizer(t).input_ids for t in texts[:4]])
    assert max(abs(d["score"] - e) for d, e in zip(body["data"], expected)) < 1e-4
