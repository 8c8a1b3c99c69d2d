"""A second server with --api-key, --step-tag-id (process reward), tight request limits and capped weight updates."""

import pytest
import requests

from verl_vllm_rm.weight_sync import RewardModelPublisher, WeightUpdateRefused

from verl_vllm_rm.parity.reference import sequence_scores, step_scores
from verl_vllm_rm.replicas.launcher import running_server

pytestmark = pytest.mark.server  # starts its own server (with --api-key and step tags)

KEY = "test-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMITS = ["--max-score-batch", "16", "--max-request-bytes", "4096"]
WEIGHT_CAP = 1024  # the head (512 bytes) fits, a full update does not
WEIGHT_UPDATES = ["--enable-weight-updates", "--weight-update-max-bytes", str(WEIGHT_CAP)]


@pytest.fixture(scope="module")
def step_server(tiny_rm, tokenizer, server_args):
    step_id = tokenizer.convert_tokens_to_ids("<step>")
    args = [*server_args, "--api-key", KEY, "--step-tag-id", str(step_id), *LIMITS, *WEIGHT_UPDATES]
    with running_server(tiny_rm, args) as server:
        yield server, step_id


@pytest.mark.parametrize(
    "method,path,payload",
    [
        ("post", "/score", {"input": ["a"]}),
        ("get", "/runtime_version", None),
        ("get", "/get_world_size", None),
        ("post", "/classify", {"input": "a"}),
        ("post", "/pooling", {"input": "a"}),
        ("post", "/v1/score", {"text_1": "a", "text_2": "b"}),
    ],
)
def test_api_key_guards_every_route(step_server, method, path, payload):
    server, _ = step_server
    url = server.url + path
    no_key = requests.request(method, url, json=payload, timeout=30)
    assert no_key.status_code == 401
    wrong = requests.request(method, url, json=payload, headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401
    if path in ("/score", "/runtime_version", "/get_world_size"):
        assert "API key" in no_key.json()["error"]["message"]
        assert requests.request(method, url, json=payload, headers=AUTH, timeout=30).status_code == 200


def test_health_stays_open_for_liveness_probes(step_server):
    server, step_id = step_server
    body = requests.get(f"{server.url}/health", timeout=10).json()
    assert body["status"] == "ok" and body["step_tag_id"] == step_id


@pytest.mark.parametrize("method", ["get", "post"])
def test_ping_stays_open_for_liveness_probes(step_server, method):
    """vLLM's other liveness route, /ping (GET and POST), answers without the key on a keyed server, while
    the route beside it, /metrics, still needs it."""
    server, _ = step_server
    assert requests.request(method, f"{server.url}/ping", timeout=10).status_code == 200
    assert requests.request(method, f"{server.url}/ping", headers={"Authorization": "Bearer nope"},
                            timeout=10).status_code == 200
    assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 401


def test_step_scores_match_transformers_at_step_tags(step_server, tokenizer, hf_model):
    server, step_id = step_server
    texts = [
        "What is 2 + 3? <step> first add <step> The answer is 5. <step>",
        "What is 9 * 9? <step> The answer is 81.",
        "no steps here",
    ]
    ids = [tokenizer(t).input_ids for t in texts]
    resp = requests.post(f"{server.url}/score", json={"input": ids}, headers=AUTH, timeout=60)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    expected_steps = step_scores(hf_model, ids, step_id)
    assert [len(d["step_scores"]) for d in data] == [3, 1, 0]
    for d, exp in zip(data, expected_steps):
        assert max((abs(a - b) for a, b in zip(d["step_scores"], exp)), default=0.0) < 1e-4
    for d, exp in zip(data, sequence_scores(hf_model, ids)):
        assert abs(d["score"] - exp) < 1e-4


def test_request_limits_give_413(step_server):
    server, _ = step_server
    too_many = requests.post(f"{server.url}/score", json={"input": ["a"] * 17}, headers=AUTH, timeout=30)
    assert too_many.status_code == 413
    assert "--max-score-batch 16" in too_many.json()["error"]["message"]
    too_big = requests.post(f"{server.url}/score", json={"input": ["x" * 5000]}, headers=AUTH, timeout=30)
    assert too_big.status_code == 413
    assert "request body of 5015 bytes exceeds --max-request-bytes 4096" in too_big.json()["error"]["message"]


def test_chunked_body_over_the_limit_is_cut_off(step_server):
    """No Content-Length to check up front: the server counts the stream and stops at the limit."""
    server, _ = step_server

    def chunks(n: int):
        yield b'{"input": ["'
        yield from (b"ab " * 100 for _ in range(n))
        yield b'"]}'

    resp = requests.post(f"{server.url}/score", data=chunks(20), headers=AUTH, timeout=30)
    assert resp.status_code == 413
    assert resp.json()["error"]["message"] == (
        "request body of more than 4096 bytes exceeds --max-request-bytes 4096"
    )
    small = requests.post(f"{server.url}/score", data=chunks(1), headers=AUTH, timeout=30)
    assert small.status_code == 200 and len(small.json()["data"]) == 1


@pytest.mark.parametrize(
    "method,path", [("get", "/weight_inventory"), ("post", "/init_communicator"),
                    ("post", "/update_param_batch"), ("post", "/close_communicator")],
)
def test_api_key_guards_weight_routes(step_server, method, path):
    server, _ = step_server
    assert requests.request(method, server.url + path, json={}, timeout=30).status_code == 401
    wrong = requests.request(method, server.url + path, json={}, headers={"Authorization": "Bearer x"}, timeout=30)
    assert wrong.status_code == 401


def test_weight_update_size_cap(step_server, hf_model):
    """A full update over --weight-update-max-bytes is refused before any tensor moves; a head update passes."""
    server, _ = step_server

    def no_update_yet():
        health = requests.get(f"{server.url}/health", timeout=10).json()  # what the server received, if anything
        return not ({"last_update", "last_failed_update", "pending_update"} & set(health))

    inventory = requests.get(f"{server.url}/weight_inventory", headers=AUTH, timeout=30).json()
    assert inventory["max_update_bytes"] == WEIGHT_CAP
    assert (inventory["transport"], inventory["nccl_version"]) == ("gloo", None)  # a CPU server has no NCCL
    with RewardModelPublisher(server.url, api_key=KEY) as pub:
        posted = []
        post_lines = pub.http.post_lines
        pub.http.post_lines = lambda path, *a, **kw: posted.append(path) or post_lines(path, *a, **kw)
        with pytest.raises(WeightUpdateRefused, match=f"more than this server's cap of {WEIGHT_CAP} bytes"):
            pub.publish(hf_model, 1, "full")
        assert posted == [] and no_update_yet()  # the publisher refused: no metadata went out
        assert requests.get(f"{server.url}/runtime_version", headers=AUTH, timeout=30).json()["version"] == 0
        body = {"metadata": [{"name": "model.layers.0.mlp.down_proj.weight", "dtype": "float32", "shape": [128, 256]}],
                "training_mode": "full", "version": 1, "bucket_bytes": 1 << 20}
        pub.connect()  # a live communicator: the refusal must come from the cap
        resp = requests.post(f"{server.url}/update_param_batch", json=body, headers=AUTH, timeout=30)
        assert resp.status_code == 400 and "(--weight-update-max-bytes)" in resp.json()["error"]["message"]
        assert no_update_yet()  # refused before the update started: no tensor was awaited
        assert pub.publish(hf_model, 1, "head_only").num_bytes == 512
        assert posted == ["/update_param_batch"]
    assert requests.get(f"{server.url}/runtime_version", headers=AUTH, timeout=30).json()["version"] == 1
    assert requests.get(f"{server.url}/health", timeout=10).json()["last_update"]["status"] == "ok"
