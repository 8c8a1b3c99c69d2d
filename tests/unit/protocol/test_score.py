"""The /score schema both ways, without a server: request parsing (the server's 4xx) and
the answer's builder and parser (the client's check)."""

from __future__ import annotations

import json
import math
import re

import pytest

from verl_vllm_rm.protocol.errors import RequestError
from verl_vllm_rm.protocol.score import (
    ScoreRequest,
    ScoreResponseError,
    check_token_ids,
    finite_or_raise,
    longest_input,
    parse_score_request,
    parse_score_response,
    score_response,
)

MODELS = ["rm"]
MAX_BATCH = 4
FIELDS = "['model', 'input', 'normalize']"
SHAPE = "a non-empty list of strings or of token-id lists"
NOT_FINITE = "is not a JSON value (JSON numbers are finite); send a finite number"
DEEP = "request body nests JSON arrays/objects too deeply to parse; send a flat JSON object"
BIG_INT = "request body has an integer of more than 4300 digits; no field of this API takes one"


def parse(body: bytes) -> ScoreRequest:
    return parse_score_request(body, MODELS, MAX_BATCH)


@pytest.mark.parametrize(
    "body, expected",
    [
        (b'{"input": ["a", "b"]}', ScoreRequest(None, ["a", "b"], None, False)),
        (b'{"input": [[1, 2], [3]], "normalize": true, "model": "rm"}', ScoreRequest("rm", None, [[1, 2], [3]], True)),
        (b'{"input": [[0]]}', ScoreRequest(None, None, [[0]], False)),
        (b'{"input": ["\\ud83d\\ude00"]}', ScoreRequest(None, ["\U0001F600"], None, False)),  # a surrogate *pair*
        (b'\xef\xbb\xbf{"input": ["a"]}', ScoreRequest(None, ["a"], None, False)),  # UTF-8 BOM
        (b'{"input": ["a\\u0000b"]}', ScoreRequest(None, ["a\x00b"], None, False)),
    ],
    ids=["texts", "token ids", "id 0", "surrogate pair", "bom", "nul"],
)
def test_valid_requests(body, expected):
    assert parse(body) == expected


BAD_REQUESTS = [
    # (id, body, status, exact message)
    ("empty body", b"", 400,
     "request body is not valid JSON (Expecting value: line 1 column 1 (char 0)); send a JSON object"),
    ("not json", b"{bad json", 400,
     "request body is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
     "send a JSON object"),
    ("trailing data", b'{"input": ["a"]} x', 400,
     "request body is not valid JSON (Extra data: line 1 column 18 (char 17)); send a JSON object"),
    ("invalid utf-8", b'{"input": ["a\xffb"]}', 400,
     "request body is not UTF-8 ('utf-8' codec can't decode byte 0xff in position 13: invalid start byte); "
     "send UTF-8 encoded JSON"),
    ("null", b"null", 400, f"request body must be a JSON object with fields {FIELDS}, got a JSON null"),
    ("top-level array", b'["a"]', 400, f"request body must be a JSON object with fields {FIELDS}, got a JSON array"),
    ("top-level string", b'"a"', 400, f"request body must be a JSON object with fields {FIELDS}, got a JSON string"),
    ("deep nesting", b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, DEEP),
    ("deep object", b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, 400, DEEP),
    ("int over the digit limit", b'{"input": [[' + b"9" * 5000 + b"]]}", 400, BIG_INT),
    ("NaN", b'{"input": [[NaN]]}', 400, f"NaN {NOT_FINITE}"),
    ("Infinity", b'{"input": ["a"], "normalize": Infinity}', 400, f"Infinity {NOT_FINITE}"),
    ("-Infinity", b'{"input": ["a"], "model": -Infinity}', 400, f"-Infinity {NOT_FINITE}"),
    ("float overflow", b'{"input": [[1e999]]}', 400,
     "number '1e999' is too large for a 64-bit float; send a finite number"),
    ("duplicate key", b'{"input": ["a"], "input": [[1]]}', 400,
     "key 'input' appears twice in one JSON object; send each key once"),
    ("unknown field", b'{"input": ["a"], "temperature": 1}', 400,
     f"unknown field(s) ['temperature']; valid fields are {FIELDS}"),
    ("many unknown fields", json.dumps({f"k{i}": 0 for i in range(10)}).encode(), 400,
     f"unknown field(s) ['k0', 'k1', 'k2', 'k3', 'k4', 'k5', ...]; valid fields are {FIELDS}"),
    ("model list", b'{"input": ["a"], "model": ["rm"]}', 400, "'model' must be a string, one of ['rm']; got ['rm']"),
    ("model number", b'{"input": ["a"], "model": 1}', 400, "'model' must be a string, one of ['rm']; got 1"),
    ("unknown model", b'{"input": ["a"], "model": "gpt-9"}', 404,
     "model 'gpt-9' is not served here; served models: ['rm']"),
    ("huge model name", json.dumps({"input": ["a"], "model": "m" * 10_000}).encode(), 404,
     f"model '{'m' * 27}...{'m' * 28}' is not served here; served models: ['rm']"),
    ("normalize string", b'{"input": ["a"], "normalize": "yes"}', 400, "'normalize' must be true or false, got 'yes'"),
    ("normalize number", b'{"input": ["a"], "normalize": 1}', 400, "'normalize' must be true or false, got 1"),
    ("normalize nested", b'{"input": ["a"], "normalize": [[[[1]]]]}', 400,
     "'normalize' must be true or false, got [[[...]]]"),
    ("missing input", b'{"normalize": true}', 400, f"missing field 'input': {SHAPE}"),
    ("input null", b'{"input": null}', 400, f"'input' must be {SHAPE}, got None"),
    ("input dict", b'{"input": {"a": 1}}', 400, f"'input' must be {SHAPE}, got {{'a': 1}}"),
    ("input number", b'{"input": 3}', 400, f"'input' must be {SHAPE}, got 3"),
    ("input string", b'{"input": "a"}', 400, f"'input' must be {SHAPE}, got 'a'"),
    ("input empty list", b'{"input": []}', 400, f"'input' must be {SHAPE}, got []"),
    ("too many items", b'{"input": ["a", "b", "c", "d", "e"]}', 413,
     "'input' has 5 items, more than this server's --max-score-batch 4; split the request"),
    ("numbers", b'{"input": [1, 2]}', 400,
     "'input' mixes or uses unsupported item types ['number']; send all strings or all token-id lists"),
    ("mixed", b'{"input": ["a", [1], null, {}]}', 400,
     "'input' mixes or uses unsupported item types ['array', 'null', 'object', 'string']; "
     "send all strings or all token-id lists"),
    ("empty token list", b'{"input": [[1], []]}', 400, "input[1] is an empty token-id list"),
    ("float id", b'{"input": [[1, 2.5]]}', 400, "input[0] must contain only integer token ids; input[0][1] is 2.5"),
    ("integral float id", b'{"input": [[1.0]]}', 400,
     "input[0] must contain only integer token ids; input[0][0] is 1.0"),
    ("bool id", b'{"input": [[true]]}', 400, "input[0] must contain only integer token ids; input[0][0] is True"),
    ("string id", b'{"input": [["1"]]}', 400, "input[0] must contain only integer token ids; input[0][0] is '1'"),
    ("nested ids", b'{"input": [[[1]]]}', 400, "input[0] must contain only integer token ids; input[0][0] is [1]"),
    ("null id", b'{"input": [[1, null]]}', 400, "input[0] must contain only integer token ids; input[0][1] is None"),
    ("lone surrogate escape", b'{"input": ["ok", "a\\ud800"]}', 400,
     "input[1] has a lone UTF-16 surrogate '\\ud800' at character 1, which is not text; send valid Unicode "
     "(pair each \\ud800-\\udbff escape with a \\udc00-\\udfff)"),
    ("lone surrogate bytes", b'{"input": ["\xed\xb0\x80"]}', 400,
     "input[0] has a lone UTF-16 surrogate '\\udc00' at character 0, which is not text; send valid Unicode "
     "(pair each \\ud800-\\udbff escape with a \\udc00-\\udfff)"),
]


@pytest.mark.parametrize("body, status, message", [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_name_the_problem(body, status, message):
    with pytest.raises(RequestError, match=f"^{re.escape(message)}$") as err:
        parse(body)
    assert (err.value.status, err.value.message) == (status, message)


@pytest.mark.parametrize(
    "token_ids, message",
    [
        ([[5, 1000]], "input[0] has token id 1000 outside the vocabulary [0, 1000)"),
        ([[5], [-1]], "input[1] has token id -1 outside the vocabulary [0, 1000)"),
        ([[2**64]], "input[0] has token id 18446744073709551616 outside the vocabulary [0, 1000)"),
        ([[10**100]], f"input[0] has token id {'1' + '0' * 17}...{'0' * 19} outside the vocabulary [0, 1000)"),
        ([[5] * 9], "input[0] has 9 tokens, longer than max_model_len=8; truncate it (the client's overlong policy "
                    "does this) or restart the server with a larger --max-model-len"),
        ([[1], []], "input[1] tokenizes to no tokens; send non-empty text"),
    ],
    ids=["vocab size", "negative", "beyond int64", "100 digits", "overlong", "empty text"],
)
def test_check_token_ids(token_ids, message):
    with pytest.raises(RequestError, match=f"^{re.escape(message)}$") as err:
        check_token_ids(token_ids, vocab_size=1000, max_model_len=8)
    assert (err.value.status, err.value.message) == (400, message)
    check_token_ids([[0, 999], [1] * 8], vocab_size=1000, max_model_len=8)


def test_score_response_layout():
    assert score_response("rm", [0.5, -1.25], 7) == {
        "model": "rm",
        "data": [{"index": 0, "score": 0.5}, {"index": 1, "score": -1.25}],
        "usage": {"prompt_tokens": 7},
    }
    assert score_response("rm", [0.5, 2.0], 3, step_scores=[[0.25], []])["data"] == [
        {"index": 0, "score": 0.5, "step_scores": [0.25]},
        {"index": 1, "score": 2.0, "step_scores": []},
    ]


def test_parse_score_response_reads_what_the_server_builds():
    body = json.loads(json.dumps(score_response("rm", [0.5, -1.25, 3], 9, step_scores=[[1.0], [], [2, 3]],
                                                version=4)))
    assert body["version"] == 4
    scores = parse_score_response(body, 3)
    assert scores == [0.5, -1.25, 3.0] and scores.version == 4
    shuffled = {"data": [{"index": 1, "score": 2}, {"index": 0, "score": 1}]}
    assert parse_score_response(shuffled, 2) == [1.0, 2.0]
    assert parse_score_response(shuffled, 2).version is None  # a server that does not say


def test_heads_without_an_outcome_score_give_their_steps_or_attributes_instead():
    """A process reward model's and an attribute head's answers have no ``score``: None there, never a number."""
    prm = json.loads(json.dumps(score_response("prm", [None, None], 5, step_scores=[[0.5, -1.0], []])))
    assert prm["data"][0] == {"index": 0, "step_scores": [0.5, -1.0]}
    scores = parse_score_response(prm, 2)
    assert scores == [None, None] and scores.steps == [[0.5, -1.0], []] and scores.attributes is None
    attributes = json.loads(json.dumps(score_response("rm", [None, None], 5, attributes=[[1, 2], [3.5, -4]])))
    scores = parse_score_response(attributes, 2)
    assert scores == [None, None] and scores.attributes == [[1.0, 2.0], [3.5, -4.0]] and scores.steps is None


@pytest.mark.parametrize("version", ["3", 1.5, True, [1]])
def test_a_non_integer_weight_version_is_an_error(version):
    body = {"data": [{"index": 0, "score": 1.0}], "version": version}
    with pytest.raises(ScoreResponseError, match=r"^/score returned a non-integer weight version "):
        parse_score_response(body, 1)


def _answer(*items) -> dict:
    return {"model": "rm", "data": list(items), "usage": {"prompt_tokens": 2}}


@pytest.mark.parametrize(
    "body, message",
    [
        (None, "malformed /score response (no 'data' list): None"),
        ([1, 2], "malformed /score response (no 'data' list): [1, 2]"),
        ({"data": {"0": 1.0}}, "malformed /score response (no 'data' list): {'data': {'0': 1.0}}"),
        ({"error": {"message": "x"}}, "malformed /score response (no 'data' list): {'error': {'message': 'x'}}"),
        (_answer({"index": 0, "score": 1.0}), "/score returned 1 scores for 2 inputs"),
        (_answer({"index": 0, "score": 1.0}, [1]), "/score returned a non-object item [1]"),
        (_answer({"index": 0, "score": 1.0}, {"index": 0, "score": 2.0}), "/score returned a bad or repeated index 0"),
        (_answer({"index": 0, "score": 1.0}, {"index": 2, "score": 2.0}), "/score returned a bad or repeated index 2"),
        (_answer({"index": 0, "score": 1.0}, {"index": -1, "score": 2.0}),
         "/score returned a bad or repeated index -1"),
        (_answer({"index": 0, "score": 1.0}, {"index": True, "score": 2.0}),
         "/score returned a bad or repeated index True"),
        (_answer({"index": 0, "score": 1.0}, {"index": "1", "score": 2.0}),
         "/score returned a bad or repeated index '1'"),
        (_answer({"index": 0, "score": 1.0}, {"score": 2.0}), "/score returned a bad or repeated index None"),
        (_answer({"index": 0, "score": math.nan}, {"index": 1, "score": 2.0}),
         "/score returned a non-finite or non-numeric score nan for input 0"),
        (_answer({"index": 0, "score": 1.0}, {"index": 1, "score": -math.inf}),
         "/score returned a non-finite or non-numeric score -inf for input 1"),
        (_answer({"index": 0, "score": "1.0"}, {"index": 1, "score": 2.0}),
         "/score returned a non-finite or non-numeric score '1.0' for input 0"),
        (_answer({"index": 0, "score": False}, {"index": 1, "score": 2.0}),
         "/score returned a non-finite or non-numeric score False for input 0"),
        (_answer({"index": 0}, {"index": 1, "score": 2.0}),
         "/score returned a non-finite or non-numeric score None for input 0"),
        (_answer({"index": 0, "score": 1.0, "step_scores": [math.nan]}, {"index": 1, "score": 2.0}),
         "/score returned bad step_scores [nan] for input 0"),
        (_answer({"index": 0, "score": 1.0, "step_scores": 1.0}, {"index": 1, "score": 2.0}),
         "/score returned bad step_scores 1.0 for input 0"),
        (_answer({"index": 0, "attributes": [1.0, math.inf]}, {"index": 1, "attributes": [2.0, 3.0]}),
         "/score returned bad attributes [1.0, inf] for input 0"),
        (_answer({"index": 0, "step_scores": [1.0], "score": None}, {"index": 1, "score": 2.0}),
         "/score returned a non-finite or non-numeric score None for input 0"),
    ],
    ids=["null", "array", "data not a list", "error body", "count", "non-object", "repeated index", "index too large",
         "negative index", "bool index", "string index", "missing index", "nan", "-inf", "string score", "bool score",
         "missing score", "nan step", "steps not a list", "inf attribute", "null score beside steps"],
)
def test_bad_answers_are_errors_not_numbers(body, message):
    with pytest.raises(ScoreResponseError, match=f"^{re.escape(message)}$"):
        parse_score_response(body, 2)


def test_the_longest_input_leaves_room_for_the_reward_token_the_server_appends():
    assert longest_input({"max_model_len": 512, "reward_token": None}) == 512
    assert longest_input({"max_model_len": 512}) == 512  # a server from before the field
    assert longest_input({"max_model_len": 512, "reward_token": {"id": 1000, "token": "[UNUSED_TOKEN_130]"}}) == 511


def test_a_non_finite_score_from_the_model_is_an_error_never_a_number():
    assert finite_or_raise([0.5, -2.0], 3) == [0.5, -2.0]
    for values in ([float("nan")], [0.1, float("inf")], [-math.inf]):
        with pytest.raises(RuntimeError, match=r"^the model produced a non-finite score for input\[3\]: "):
            finite_or_raise(values, 3)
