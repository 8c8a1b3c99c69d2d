"""Any body that is not a valid /score request gets a 4xx JSON error naming the problem, never
a 500, whatever its size, shape or nesting; the server keeps scoring correctly afterwards.

Every body is posted as raw bytes, so the server sees exactly what is listed here. The
over-size bodies (413 from --max-request-bytes) are in test_server_options.py, whose
server has a small limit.
"""

import json

import pytest
import requests

from verl_vllm_rm.parity.reference import sequence_scores

JSON = {"content-type": "application/json"}
NOT_FINITE = "is not a JSON value (JSON numbers are finite)"
FIELDS = "['model', 'input', 'normalize']"
DEEP = "nests JSON arrays/objects too deeply"


def raw(payload) -> bytes:
    return json.dumps(payload).encode()


BAD_BODIES = [
    # (id, body, status, a piece of error.message)
    ("empty body", b"", 400, "request body is not valid JSON"),
    ("not json", b"{bad json", 400, "request body is not valid JSON"),
    ("trailing data", b'{"input": ["a"]} x', 400, "request body is not valid JSON (Extra data"),
    ("invalid utf-8", b'{"input": ["a\xff\xfeb"]}', 400, "request body is not UTF-8"),
    ("utf-16 bom only", b"\xff\xfe", 400, "request body is not valid JSON"),
    ("null", b"null", 400, f"must be a JSON object with fields {FIELDS}, got a JSON null"),
    ("top-level array", b'["a"]', 400, f"must be a JSON object with fields {FIELDS}, got a JSON array"),
    ("top-level string", b'"a"', 400, f"must be a JSON object with fields {FIELDS}, got a JSON string"),
    ("deep nesting", b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, DEEP),
    ("deep objects", b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, 400, DEEP),
    ("900-level ids", b'{"input": ' + b"[" * 900 + b"]" * 900 + b"}", 400, "input[0][0] is [[[...]]]"),
    ("int over the digit limit", b'{"input": [[' + b"9" * 5000 + b"]]}", 400, "an integer of more than 4300 digits"),
    ("id beyond int64", b'{"input": [[5, 99999999999999999999999]]}', 400,
     "token id 99999999999999999999999 outside the vocabulary [0, 1000)"),
    ("id of 4000 digits", b'{"input": [[' + b"9" * 4000 + b"]]}", 400,
     "token id 999999999999999999...9999999999999999999 outside the vocabulary"),
    ("id outside vocab", raw({"input": [[5, 100000]]}), 400, "token id 100000 outside the vocabulary [0, 1000)"),
    ("negative id", raw({"input": [[5, -1]]}), 400, "token id -1 outside the vocabulary [0, 1000)"),
    ("float id", raw({"input": [[1, 2.5]]}), 400, "input[0] must contain only integer token ids; input[0][1] is 2.5"),
    ("bool id", raw({"input": [[True, 2]]}), 400, "input[0] must contain only integer token ids; input[0][0] is True"),
    ("string id", raw({"input": [["1"]]}), 400, "input[0] must contain only integer token ids; input[0][0] is '1'"),
    ("nested ids", raw({"input": [[[1], [2]]]}), 400, "input[0][0] is [1]"),
    ("NaN id", b'{"input": [[NaN]]}', 400, f"NaN {NOT_FINITE}"),
    ("Infinity normalize", b'{"input": ["a"], "normalize": Infinity}', 400, f"Infinity {NOT_FINITE}"),
    ("-Infinity model", b'{"input": ["a"], "model": -Infinity}', 400, f"-Infinity {NOT_FINITE}"),
    ("float overflow", b'{"input": [[1e999]]}', 400, "number '1e999' is too large for a 64-bit float"),
    ("lone surrogate escape", b'{"input": ["a\\ud800b"]}', 400, "input[0] has a lone UTF-16 surrogate '\\ud800'"),
    ("lone surrogate bytes", b'{"input": ["a\xed\xa0\x80b"]}', 400, "input[0] has a lone UTF-16 surrogate '\\ud800'"),
    ("duplicate key", b'{"input": ["a"], "input": [[1]]}', 400, "key 'input' appears twice in one JSON object"),
    ("missing input", raw({"normalize": True}), 400, "missing field 'input'"),
    ("input empty list", raw({"input": []}), 400, "'input' must be a non-empty list"),
    ("input string", raw({"input": "hello"}), 400, "'input' must be a non-empty list"),
    ("input dict", raw({"input": {"a": 1}}), 400, "'input' must be a non-empty list"),
    ("input number", raw({"input": 3}), 400, "'input' must be a non-empty list"),
    ("input of empty strings", raw({"input": ["", ""]}), 400, "input[0] tokenizes to no tokens"),
    ("numbers", raw({"input": [1, 2, 3]}), 400, "unsupported item types ['number']"),
    ("dicts", raw({"input": [{"text": "a"}]}), 400, "unsupported item types ['object']"),
    ("mixed str and ids", raw({"input": ["a", [1, 2]]}), 400,
     "mixes or uses unsupported item types ['array', 'string']"),
    ("mixed str and null", raw({"input": ["a", None]}), 400, "mixes or uses unsupported item types ['null', 'string']"),
    ("empty token list", raw({"input": [[]]}), 400, "input[0] is an empty token-id list"),
    ("overlong ids", raw({"input": [[5] * 600]}), 400, "600 tokens, longer than max_model_len=512"),
    ("overlong text", raw({"input": ["ok", "the answer is " * 300]}), 400, "input[1] has"),
    ("unknown model", raw({"input": ["a"], "model": "gpt-9"}), 404, "model 'gpt-9' is not served here"),
    ("model list", raw({"input": ["a"], "model": ["gpt-9"]}), 400, "'model' must be a string"),
    ("model number", raw({"input": ["a"], "model": 1}), 400, "'model' must be a string"),
    ("unknown field", raw({"input": ["a"], "temperature": 1}), 400, "unknown field(s) ['temperature']"),
    ("many unknown fields", raw({f"k{i}": 1 for i in range(20_000)}), 400, "unknown field(s) ['k0', 'k1', 'k10', "),
    ("normalize not bool", raw({"input": ["a"], "normalize": "yes"}), 400, "'normalize' must be true or false"),
    ("normalize long list", raw({"input": ["a"], "normalize": list(range(100_000))}), 400,
     "'normalize' must be true or false, got [0, 1, 2, 3, 4, 5, ...]"),
    ("too many inputs", raw({"input": ["a"] * 4097}), 413, "more than this server's --max-score-batch 4096"),
    ("too many id lists", raw({"input": [[1]] * 4097}), 413, "more than this server's --max-score-batch 4096"),
]


def post(url: str, body: bytes, headers=JSON) -> requests.Response:
    return requests.post(f"{url}/score", data=body, headers=headers, timeout=60)


@pytest.mark.parametrize("body, status, needle", [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bad_body_is_a_clear_4xx(rm_server, body, status, needle):
    resp = post(rm_server.url, body)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert needle in error["message"] and error["code"] == status
    assert len(error["message"]) < 400  # names the problem without echoing the body back


@pytest.mark.parametrize(
    "headers",
    [{}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}],
    ids=["no content-type", "text/plain", "form"],
)
def test_content_type_is_not_what_decides(rm_server, headers, texts):
    """The body decides: valid JSON scores whatever the content-type (``curl -d`` sends a form type)."""
    good = raw({"input": texts[:2]})
    assert post(rm_server.url, good, headers).json() == post(rm_server.url, good).json()
    bad = post(rm_server.url, b"input=a", headers)
    assert bad.status_code == 400 and "request body is not valid JSON" in bad.json()["error"]["message"]


def test_server_still_healthy_and_correct_after_bad_input(rm_server, tokenizer, hf_model, texts):
    for _, body, _, _ in BAD_BODIES:
        post(rm_server.url, body)
    health = requests.get(f"{rm_server.url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["type"] == "reward_model"
    resp = post(rm_server.url, raw({"input": texts[:4]}))
    assert resp.status_code == 200
    expected = sequence_scores(hf_model, [tokenizer(t).input_ids for t in texts[:4]])
    assert max(abs(d["score"] - e) for d, e in zip(resp.json()["data"], expected)) < 1e-4
