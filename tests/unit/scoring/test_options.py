"""The ``vllm_rm`` manager's options (``scoring/options.py``): ``reward_kwargs`` parsed through the one validator,
reward models over the top-level options, routes, the composition they stand for, and every error naming its entry.
(The same options refused when verl loads the manager: tests/unit/scoring/test_manager.py.)"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.protocol.defaults import DEFAULT_SERVER_URL
from verl_vllm_rm.rewards import RewardConfig
from verl_vllm_rm.scoring.options import (
    RewardModelOptions,
    attribute_whitening_key,
    parse_options,
    per_member_columns,
    reward_kwargs_of,
    run_options,
    run_reward_models,
)


def test_reward_kwargs_report_nested_reward_paths():
    from verl_vllm_rm.scoring.options import parse_options

    with pytest.raises(ConfigError, match=r"^reward_kwargs\.rewards\.length\.min_tokens must be an integer, got 'a'$"):
        parse_options({"rewards": {"length": {"min_tokens": "a"}}})
    with pytest.raises(ConfigError, match=r"^reward_kwargs\.rewards\.length: overlong_buffer=8 needs"):
        parse_options({"rewards": {"length": {"overlong_buffer": 8}}})
    with pytest.raises(ConfigError, match=r"^reward_kwargs: combine='add' and rewards are exclusive.*rewards\.gate"):
        parse_options({"rewards": {}, "combine": "add"})
    with pytest.raises(ConfigError, match=r"^reward_kwargs: max_batch_seqs must be > 0, got 0$"):
        parse_options({"max_batch_seqs": 0})


def test_reward_models_inherit_the_top_level_options_and_routes_name_known_ones():
    from verl_vllm_rm.scoring.options import parse_options

    opts = parse_options({"server_url": "http://a:1", "failure_policy": "mask", "max_retries": 1,
                          "reward_models": [{"name": "helpful"}, {"name": "safety", "server_url": ["http://b:1"],
                                                                  "failure_policy": "raise"}],
                          "routes": [{"data_source": "math/*", "reward_models": ["safety"], "ensemble": "min"}]})
    helpful, safety = opts.rm_options
    assert (helpful.client.server_url, helpful.failure_policy, helpful.client.max_retries) == (["http://a:1"], "mask",
                                                                                                1)
    assert (safety.client.server_url, safety.failure_policy, safety.client.max_retries) == (["http://b:1"], "raise", 1)
    assert opts.route_models(opts.routes[0]) == ("safety",)
    single = parse_options({"server_url": "http://a:1"})
    assert [rm.name for rm in single.rm_options] == ["rm"]
    assert single.route_models(single.route_options()[0]) == ("rm",) and single.route_options()[0].data_source == ["*"]


@pytest.mark.parametrize(("raw", "message"), [
    ({"reward_models": [{"server_url": "http://b:1"}]}, r"reward_models\[0\] needs a name"),
    ({"reward_models": [{"name": "Helpful"}]}, r"reward model name 'Helpful' must match"),
    ({"reward_models": [{"name": "a", "whiten": "zscore"}]}, r"reward_models\[0\]\.whiten='zscore' is not one of"),
    ({"reward_models": [{"name": "a", "sever_url": "x"}]}, r"unknown reward_models\[0\] option.*'server_url'"),
    ({"reward_models": [{"name": "a"}, {"name": "a"}]}, r"names must be unique, got \['a', 'a'\]"),
    ({"routes": [{"data_source": "x", "reward_models": ["b"]}]},
     r"routes\[0\]\.reward_models names \['b'\], which are"),
    ({"routes": [{"data_source": "x", "reward_models": []}]}, r"routes\[0\] .*composes 'rubric'.*no reward model"),
    ({"routes": [{"reward_models": []}]}, r"missing required reward_kwargs\.routes\[0\] option\(s\) \['data_source'\]"),
    ({"routes": [{"data_source": "x", "uncertainty_penalty": -1}]}, r"uncertainty_penalty must be >= 0"),
])
def test_reward_model_and_route_errors_name_the_entry(raw, message):
    from verl_vllm_rm.scoring.options import parse_options

    with pytest.raises(ConfigError, match=message):
        parse_options(raw)


def test_reward_kwargs_defaults_come_from_the_protocol(monkeypatch):
    from verl_vllm_rm.protocol.defaults import API_KEY_ENV, DEFAULT_SERVER_URL
    from verl_vllm_rm.scoring.options import parse_options

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert parse_options(None).rm.client.server_url == [DEFAULT_SERVER_URL]
    assert parse_options(None).rm.client.api_key is None
    monkeypatch.setenv(API_KEY_ENV, "k-env")
    assert parse_options({}).rm.client.api_key == "k-env"
    assert parse_options({"api_key": "k-own"}).rm.client.api_key == "k-own"



def test_managed_replicas_replace_server_url_and_an_rm_with_both_is_refused():
    with pytest.raises(ConfigError, match=r"reward model 'rm' has both server_url \['http://a:1'\] and replicas: "
                                          r"managed replicas replace server_url; drop one of them"):
        parse_options({"server_url": "http://a:1", "replicas": {"model": "/rm"}})
    # an entry's own replicas drop the top level's servers, an entry's own servers the top level's replicas
    opts = parse_options({"server_url": "http://a:1",
                          "reward_models": [{"name": "managed", "replicas": {"model": "/m"}}, {"name": "served"}]})
    managed, served = opts.rm_options
    assert (managed.replicas.model, managed.client.server_url) == ("/m", [DEFAULT_SERVER_URL])
    assert (served.replicas, served.client.server_url) == (None, ["http://a:1"])
    opts = parse_options({"replicas": {"model": "/top"}, "reward_models": [{"name": "own", "server_url": "http://b:1"},
                                                                           {"name": "inherits"}]})
    own, inherits = opts.rm_options
    assert (own.replicas, own.client.server_url) == (None, ["http://b:1"])
    assert inherits.replicas.model == "/top"


def test_whitening_keys_are_the_rms_name_or_one_per_attribute():
    assert RewardModelOptions(name="rm").whitening_keys == ()  # whiten=none: no statistics kept
    assert RewardModelOptions(name="rm", whiten="running").whitening_keys == ("rm",)
    attributes = RewardModelOptions(name="attrs", whiten="running", attributes={"helpfulness": 1.0, "verbosity": 0.0})
    assert attributes.whitening_keys == ("attrs/helpfulness", "attrs/verbosity")
    assert attribute_whitening_key("attrs", "verbosity") == "attrs/verbosity"


def test_columns_per_member_with_several_rms_or_a_whitened_one():
    one, other = RewardModelOptions(name="one"), RewardModelOptions(name="other")
    assert not per_member_columns([one])
    assert per_member_columns([one, other])
    assert per_member_columns([RewardModelOptions(name="one", whiten="running")])


def test_the_composition_is_rewards_or_what_combine_stands_for():
    weighted = parse_options({"combine": "weighted", "alpha": 0.25}).reward_config()
    assert weighted.components == ("rubric", "verifiable")
    assert dict(weighted.weights) == {"rubric": 0.25, "verifiable": 0.75}
    assert parse_options({}).reward_config() == RewardConfig(components=("rubric",), weights={"rubric": 1.0})
    assert parse_options({"rewards": {}}).reward_config() == RewardConfig()  # RM-Gallery's recipe
    route = parse_options({"routes": [{"data_source": ["*"], "reward_models": []}],
                           "rewards": {"components": ["format"]}}).route_options()[0]
    assert route.reward_models == () and route.rewards is None


def test_a_verl_config_gives_options_only_when_its_reward_manager_is_vllm_rm():
    config = OmegaConf.create({"reward": {"reward_manager": {"name": "vllm_rm"},
                                          "reward_kwargs": {"server_url": "http://a:1", "failure_policy": "mask"}}})
    assert reward_kwargs_of(config) == {"server_url": "http://a:1", "failure_policy": "mask"}
    (rm,) = run_reward_models(config)
    assert (rm.name, rm.client.server_url, rm.failure_policy) == ("rm", ["http://a:1"], "mask")
    assert run_options(config).rm == rm
    naive = OmegaConf.create({"reward": {"reward_manager": {"name": "naive"}, "reward_kwargs": {"server_url": 3}}})
    assert run_options(naive) is None and run_reward_models(naive) == ()  # its reward_kwargs are not ours to check
    assert reward_kwargs_of(None) == {} and reward_kwargs_of({"reward": {}}) == {}
    with pytest.raises(ConfigError, match=r"reward_kwargs\.failure_policy='drop' is not one of"):
        run_options(OmegaConf.create({"reward": {"reward_manager": {"name": "vllm_rm"},
                                                 "reward_kwargs": {"failure_policy": "drop"}}}))
