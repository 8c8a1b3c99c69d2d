"""Two-phase commit on one real server: a staged version is received but not served until committed; an
aborted one never serves; while one is staged, every other update is refused and the old weights serve."""

from __future__ import annotations

import pytest
import requests
from sync_helpers import assert_parity, load_rm, perturbed, reset_server, runtime_version

from verl_vllm_rm.weight_sync import RewardModelPublisher, WeightUpdateRefused

pytestmark = pytest.mark.server


def staged(url: str) -> int | None:
    return requests.get(f"{url}/health", timeout=10).json().get("staged_update")


def test_staged_commit_and_abort(ws_server, tiny_rm, probe_ids):
    url = ws_server.url
    start = reset_server(url, tiny_rm)
    base, new, other = load_rm(tiny_rm), perturbed(load_rm(tiny_rm), 1), perturbed(load_rm(tiny_rm), 2)
    try:
        with RewardModelPublisher(url, timeout_s=60) as pub:
            result = pub.publish(new, start + 1, "full", commit=False)
            assert result.server["status"] == "staged" and result.num_params > 0
            # received, not serving: the old weights and version answer, /health names the staged version
            assert staged(url) == start + 1 and runtime_version(url) == start and pub.version == start
            assert_parity(url, base, probe_ids)
            with pytest.raises(WeightUpdateRefused, match=f"version {start + 1} is staged: POST /commit_update"):
                pub.publish(other, start + 2, "full")
            with pytest.raises(WeightUpdateRefused, match=f"must be the staged version {start + 1}, got {start + 7}"):
                pub.commit(start + 7)

            record = pub.commit(start + 1)
            assert record["status"] == "ok" and record["version"] == start + 1
            assert runtime_version(url) == start + 1 and staged(url) is None and pub.version == start + 1
            assert_parity(url, new, probe_ids)

            pub.publish(other, start + 2, "full", commit=False)
            assert pub.abort(start + 2)["status"] == "aborted"
            assert runtime_version(url) == start + 1 and staged(url) is None
            assert_parity(url, new, probe_ids)  # the aborted version never served
            with pytest.raises(WeightUpdateRefused, match="no update is staged"):
                pub.abort(start + 2)

            pub.publish(other, start + 2, "full")  # the same session takes the next update
            assert runtime_version(url) == start + 2
            assert_parity(url, other, probe_ids)
    finally:
        if staged(url) is not None:  # never leave the session's server with an update hanging
            requests.post(f"{url}/abort_update", json={"version": staged(url)}, timeout=60)
        reset_server(url, tiny_rm)


@pytest.mark.parametrize("body, message", [
    ({"version": 1}, "no update is staged"),
    ([], "request body must be a JSON object"),
])
def test_second_phase_without_a_staged_update_is_a_4xx(ws_server, body, message):
    for path in ("/commit_update", "/abort_update"):
        resp = requests.post(f"{ws_server.url}{path}", json=body, timeout=10)
        assert 400 <= resp.status_code < 500 and message in resp.json()["error"]["message"], resp.text


def test_unknown_commit_mode_is_refused(ws_server, tiny_rm):
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:
        pub.connect()
        body = {"metadata": [], "training_mode": "full", "version": pub.version + 1, "bucket_bytes": 1024,
                "commit": "later"}
        resp = requests.post(f"{ws_server.url}/update_param_batch", json=body, timeout=10)
    assert resp.status_code == 400 and "'commit' must be one of ['now', 'deferred']" in resp.text
