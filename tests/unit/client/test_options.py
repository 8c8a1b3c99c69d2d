"""The options every client section shares (``client/options.py``, ``ClientOptions``): the defaults, the key from the
environment, and the values refused naming the option (the same keys read from ``reward_kwargs``:
tests/unit/scoring/test_options.py)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.client.options import ClientOptions


def test_the_default_server_is_the_local_one_and_the_key_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("VERL_VLLM_RM_API_KEY", raising=False)
    opts = ClientOptions()
    assert opts.server_url == ["http://127.0.0.1:8001"] and opts.api_key is None and opts.model is None
    assert (opts.max_retries, opts.max_batch_seqs, opts.max_batch_tokens, opts.deadline_s) == (4, 256, 131072, 900.0)
    monkeypatch.setenv("VERL_VLLM_RM_API_KEY", "k-env")
    assert ClientOptions().api_key == "k-env" and ClientOptions(api_key="k-own").api_key == "k-own"
    monkeypatch.setenv("VERL_VLLM_RM_API_KEY", "")  # set but empty: no key
    assert ClientOptions().api_key is None


def test_the_defaults_are_not_shared_between_instances():
    a, b = ClientOptions(), ClientOptions()
    a.server_url.append("http://other:1")
    assert b.server_url == ["http://127.0.0.1:8001"]


@pytest.mark.parametrize("kwargs, message", [
    ({"server_url": ["http://a:1", "127.0.0.1:8001"]},
     r"server_url entry '127\.0\.0\.1:8001' must start with http:// or https://"),
    ({"server_url": ["ftp://a:1"]}, r"server_url entry 'ftp://a:1' must start with http:// or https://"),
    ({"max_retries": -1}, r"max_retries must be >= 0, got -1"),
    ({"backoff_base_s": -0.5}, r"backoff_base_s must be >= 0, got -0\.5"),
    ({"endpoint_cooldown_s": -1}, r"endpoint_cooldown_s must be >= 0, got -1"),
    ({"max_batch_tokens": 0}, r"max_batch_tokens must be > 0, got 0"),
    ({"max_concurrent_requests": 0}, r"max_concurrent_requests must be > 0, got 0"),
    ({"deadline_s": 0}, r"deadline_s must be > 0, got 0"),
    ({"connect_timeout_s": -2}, r"connect_timeout_s must be > 0, got -2"),
])
def test_values_out_of_range_are_refused_naming_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClientOptions(**kwargs)


def test_zero_retries_zero_backoff_and_https_are_accepted():
    opts = ClientOptions(server_url=["https://rm.example:443"], max_retries=0, backoff_base_s=0, backoff_max_s=0,
                         endpoint_cooldown_s=0)
    assert (opts.server_url, opts.max_retries, opts.endpoint_cooldown_s) == (["https://rm.example:443"], 0, 0)
