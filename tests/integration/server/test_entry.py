"""Health, version, world size, vLLM's own routes and the default bind address."""

import requests
from process_helpers import listening_ip


def test_health_reports_a_ready_reward_model(rm_server):
    resp = requests.get(f"{rm_server.url}/health", timeout=10)
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "ok" and body["type"] == "reward_model"
    assert body["max_model_len"] == 512 and body["version"] == 0 and body["step_tag_id"] is None


def test_runtime_version_and_world_size(rm_server):
    assert requests.get(f"{rm_server.url}/runtime_version", timeout=10).json() == {"version": 0}
    assert requests.get(f"{rm_server.url}/get_world_size", timeout=10).json() == {"world_size": 1}


def test_vllm_routes_stay_available(rm_server, post_score, texts):
    _, ours = post_score(rm_server.url, {"input": texts[:2]})
    classify = requests.post(
        f"{rm_server.url}/classify", json={"input": texts[:2], "use_activation": False}, timeout=30
    ).json()
    assert [d["probs"][0] for d in classify["data"]] == [d["score"] for d in ours["data"]]
    assert requests.post(f"{rm_server.url}/pooling", json={"input": texts[0]}, timeout=30).status_code == 200
    assert "vllm:" in requests.get(f"{rm_server.url}/metrics", timeout=10).text


def test_binds_loopback_by_default(rm_server):
    """No --host given: the server must not listen on every interface."""
    port = int(rm_server.url.rsplit(":", 1)[1])
    assert listening_ip(rm_server.process.pid, port) == "127.0.0.1"
