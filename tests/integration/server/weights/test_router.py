"""The weight routes read JSON with the /score parser: a malformed body is a 4xx naming the problem,
never a 500, and a bad field is refused before any worker tries to join a process group."""

import pytest
import requests

JSON = {"content-type": "application/json"}
PORT = "'master_port' must be an integer port in [1, 65535]"
MALFORMED = [
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, "nests JSON arrays/objects too deeply"),
    ("int over the digit limit", b'{"master_port": ' + b"9" * 5000 + b"}", "an integer of more than 4300 digits"),
    ("NaN", b'{"master_address": "127.0.0.1", "master_port": 1, "session": "s", "timeout_s": NaN}',
     "NaN is not a JSON value"),
    ("duplicate key", b'{"session": "a", "session": "b"}', "key 'session' appears twice"),
    ("invalid utf-8", b'{"session": "\xff"}', "request body is not UTF-8"),
    ("empty body", b"", "request body is not valid JSON"),
    ("top-level array", b"[1]", "request body must be a JSON object"),
]


@pytest.mark.parametrize("path", ["/init_communicator", "/update_param_batch"])
@pytest.mark.parametrize("body, needle", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_json_is_a_400(ws_server, path, body, needle):
    resp = requests.post(f"{ws_server.url}{path}", data=body, headers=JSON, timeout=30)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"master_port": 10**30}, f"{PORT}, got 1000000000000000000000000000000"),
        ({"master_port": "29500"}, f"{PORT}, got '29500'"),
        ({"master_address": ["127.0.0.1"]}, "'master_address' must be a non-empty string, got ['127.0.0.1']"),
        ({"session": ""}, "'session' must be a non-empty string, got ''"),
        ({"timeout_s": "nan"}, "'timeout_s' must be a positive number of seconds, got 'nan'"),
        ({"timeout_s": 0}, "'timeout_s' must be a positive number of seconds, got 0"),
        ({"timeout_s": True}, "'timeout_s' must be a positive number of seconds, got True"),
    ],
    ids=["port beyond int64", "port as string", "address list", "empty session", "timeout string", "timeout 0",
         "timeout bool"],
)
def test_bad_init_fields_are_a_400_not_a_failed_join(ws_server, fields, needle):
    body = {"master_address": "127.0.0.1", "master_port": 29500, "session": "s", "timeout_s": 5, **fields}
    resp = requests.post(f"{ws_server.url}/init_communicator", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"] == needle
    assert requests.get(f"{ws_server.url}/health", timeout=10).json()["status"] == "ok"
