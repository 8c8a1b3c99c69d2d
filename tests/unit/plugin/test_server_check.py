"""``plugin.server_check`` without a server: which reward models are on listed servers (and the option that lists
them), and a run whose listed servers refuse connections stopped with each one named (a server that answers, and
one that does not beside it: tests/integration/plugin/test_server_check.py)."""

from __future__ import annotations

import pytest
import refused_ports

from verl_vllm_rm.client.reward_client import RewardServerError
from verl_vllm_rm.plugin.server_check import check_listed_servers, listed_rms
from verl_vllm_rm.scoring.options import parse_options

FAST = {"max_retries": 0, "deadline_s": 5}  # one attempt: a refused connection fails at once


@pytest.fixture
def refused_urls():
    """Two loopback URLs with nothing listening (connections are refused)."""
    with refused_ports.refused_urls(2) as urls:
        yield urls


def test_the_listed_rms_are_named_with_the_option_that_lists_their_servers():
    options = parse_options({"server_url": "http://a:1", "reward_models": [
        {"name": "managed", "replicas": {"model": "/m"}}, {"name": "inherits"},
        {"name": "own", "server_url": ["http://b:1", "http://c:1"]}]})
    assert [(rm.name, rm.key, rm.client.server_url) for rm in listed_rms(options)] == [
        ("inherits", "reward_kwargs.server_url", ["http://a:1"]),
        ("own", "reward_kwargs.reward_models[2].server_url", ["http://b:1", "http://c:1"])]
    assert [rm.key for rm in listed_rms(parse_options({"server_url": "http://a:1"}))] == ["reward_kwargs.server_url"]


def test_a_run_on_managed_replicas_alone_asks_no_server():
    check_listed_servers(parse_options({"replicas": {"model": "/rm"}}))  # /rm is started by the fleet, later


def test_an_rm_none_of_whose_servers_answers_stops_the_run_naming_each_and_the_fix(refused_urls):
    options = parse_options({**FAST, "server_url": refused_urls})
    with pytest.raises(RewardServerError) as err:
        check_listed_servers(options)
    message = str(err.value)
    assert message.startswith("no reward server answers /health, checked before verl builds its workers: reward "
                              f"model 'rm' (reward_kwargs.server_url={refused_urls}): GET /health failed after 1 "
                              "attempt(s), max_retries 0 used up")
    assert all(f"{url}: " in message for url in refused_urls)  # each server's own error
    assert message.endswith("Start each server first (python -m verl_vllm_rm.server --model ...) and wait for its "
                            "/health, or fix the server_url; a server that needs longer to come up: raise that RM's "
                            "max_retries or deadline_s")


def test_only_the_rms_with_no_server_answering_are_named(refused_urls):
    options = parse_options({**FAST, "reward_models": [
        {"name": "down", "server_url": refused_urls[0]}, {"name": "managed", "replicas": {"model": "/m"}}]})
    with pytest.raises(RewardServerError, match=r"reward model 'down' \(reward_kwargs.reward_models\[0\]"
                                                r"\.server_url=\['http://127\.0\.0\.1:\d+'\]\)") as err:
        check_listed_servers(options)
    assert "managed" not in str(err.value)
