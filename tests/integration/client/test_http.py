"""``verl_vllm_rm.client.http``: the synchronous and the asynchronous call fail the same way, with the server's words."""


import pytest
from http_requests import request_once

from verl_vllm_rm.client.http import HttpError, JsonHttp


def test_refusal_carries_the_status_and_the_servers_own_message(rm_server):
    errors = []
    for call in (lambda: JsonHttp(rm_server.url).post("/score", {"input": []}),
                 lambda: request_once(rm_server.url + "/score", "POST", {"input": []})):
        with pytest.raises(HttpError) as err:
            call()
        errors.append(err.value)
    sync, async_ = errors
    assert sync.status == async_.status == 400 and not sync.transient
    assert sync.message == async_.message and not sync.message.startswith("{")  # read from the error body
    assert str(sync) == f"{rm_server.url}/score: HTTP 400: {sync.message}"


def test_both_paths_send_the_api_key(fault_proxy):
    assert JsonHttp(fault_proxy.url, api_key="k-1").get("/health")["status"] == "ok"
    assert request_once(fault_proxy.url + "/health", api_key="k-1")["status"] == "ok"
    assert [r["headers"].get("Authorization") for r in fault_proxy.requests] == ["Bearer k-1"] * 2


def test_numpy_token_ids_are_sent_as_json_integers(rm_server):
    import numpy as np

    ids = [[11, 12, 13, 14], [21, 22]]
    plain = request_once(rm_server.url + "/score", "POST", {"input": ids})
    as_numpy = request_once(rm_server.url + "/score", "POST", {"input": [np.asarray(x, dtype=np.int64) for x in ids]})
    as_numpy_ints = request_once(rm_server.url + "/score", "POST", {"input": [[np.int32(t) for t in x] for x in ids]})
    assert [d["score"] for d in plain["data"]] == [d["score"] for d in as_numpy["data"]] \
        == [d["score"] for d in as_numpy_ints["data"]]


# A new user's script: verl's load_reward_manager, one batch scored, no close(); and a bare client under
# asyncio.run, whose loop is closed before the process exits.
NO_CLOSE_MANAGER = """
import sys
from transformers import AutoTokenizer
from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.dev.loader import load_manager
url, model = sys.argv[1:3]
tok = AutoTokenizer.from_pretrained(model)
manager = load_manager(tok, url, model, {"num_examine": 0})
group = Group(tok("What is 3 + 4?").input_ids, [tok(" 7", add_special_tokens=False).input_ids])
print("score", float(manager(build_batch([group], tok.pad_token_id)).sum()))
"""


NO_CLOSE_CLIENT = """
import asyncio, sys
from verl_vllm_rm.client.reward_client import VLLMRewardClient
client = VLLMRewardClient(sys.argv[1])
print("score", asyncio.run(client.score("hello there")))
"""


@pytest.mark.parametrize("script", [NO_CLOSE_MANAGER, NO_CLOSE_CLIENT], ids=["manager", "client_asyncio_run"])
def test_a_script_that_never_closes_leaves_no_unclosed_session_at_exit(rm_server, tiny_rm, script):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "dev", "-c", script, rm_server.url, tiny_rm], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "score " in out.stdout
    assert "Unclosed" not in out.stderr, out.stderr[-3000:]


def test_served_versions_reads_each_server_that_answers_and_leaves_out_the_rest(rm_server, dead_url):
    """A down server is left out, not an error; an answering one gives the version of its /health (ok), the one its
    /score answers carry."""
    from sync_helpers import runtime_version

    from verl_vllm_rm.client.http import served_versions

    assert served_versions([dead_url, rm_server.url + "/"]) == {rm_server.url + "/": runtime_version(rm_server.url)}
    assert served_versions([dead_url]) == {}
