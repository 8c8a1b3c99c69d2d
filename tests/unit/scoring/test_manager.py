"""The ``vllm_rm`` manager loaded through verl's own ``load_reward_manager`` (real server, real verl): the in-process tests (no server; those on the real server: tests/integration/scoring/test_manager.py)."""

from __future__ import annotations

import re

import pytest
from verl_vllm_rm.client.reward_client import RewardServerError
from verl_vllm_rm.scoring.options import ConfigError
from verl_vllm_rm.dev.grpo_batch import build_batch


def test_failed_score_raises_naming_the_server(load_manager, dead_url, verl_config, tokenizer, grpo_groups):
    mgr = load_manager(verl_config(dead_url, max_retries=1, backoff_base_s=0.01, max_length=512), tokenizer)
    with pytest.raises(RewardServerError, match=dead_url.replace(".", r"\.")):
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))


def test_mask_policy_flags_and_counts_failures(load_manager, dead_url, verl_config, tokenizer, grpo_groups):
    cfg = verl_config(dead_url, max_retries=0, failure_policy="mask", max_length=512)
    mgr = load_manager(cfg, tokenizer)
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    out = mgr(data, return_dict=True)
    info = out["reward_extra_info"]
    assert info["rm_valid"] == [0.0] * len(data) and info["rm_weight_version"] == [-1.0] * len(data)
    assert all(ms > 0.0 for ms in info["rm_latency_ms"])  # the time until the failure
    assert mgr.failed == len(data)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"server_urls": "http://x"}, "unknown reward_kwargs option(s) ['server_urls']; valid options are: server_url"),
        ({"max_retries": "many"}, "max_retries must be an integer"),
        ({"failure_policy": "ignore"}, "failure_policy='ignore' is not one of ['raise', 'mask']"),
        ({"combine": "avg"}, "is not one of ['replace', 'add', 'multiply', 'weighted']"),
        ({"alpha": 2}, "alpha must be in [0, 1]"),
        ({"input_format": "chat_template"}, "input_format=chat_template needs reward_kwargs.rm_tokenizer_path (the "
                                             "reward model's tokenizer, whose chat template builds the RM input)"),
        ({"max_batch_seqs": 0}, "max_batch_seqs must be > 0"),
        ({"rubric_template": "'{prompt} {response}'", "input_format": "chat_template", "rm_tokenizer_path": "tok"},
         "rubric_template replaces input_format=chat_template; use one of them"),
        ({"step_reward": "token", "whiten": "running"},
         "step_reward=token puts each raw step score on its token; whiten rescales one number per sample: use "
         "whiten=none with it, or a scalar step_reward"),
        ({"step_reward": "token", "input_format": "chat_template", "rm_tokenizer_path": "tok"},
         "step_reward=token places step scores on the policy's own response tokens: it needs input_format=token_ids "
         "without rubric_template (or use a scalar step_reward: min, last, mean, prod)"),
        ({"step_reward": "token", "rubric_template": "'{prompt} {response}'"},
         "step_reward=token places step scores on the policy's own response tokens: it needs input_format=token_ids "
         "without rubric_template"),
        ({"rewards": "{components:[rubric,judge],weights:{judge:0.5}}"},
         "routes[0] (data_source ['*']) composes 'judge' and reward_kwargs has no judge section: add judge: "
         "{server_url: [...], mode: ...} or drop 'judge'"),
        ({"reward_models": "[{name:helpful,step_reward:token},{name:safety}]"},
         "routes[0] ensembles ['helpful', 'safety'], and ['helpful'] gives token-level step rewards, which do not "
         "ensemble: give it a route of its own or a scalar step_reward (min, last, mean, prod)"),
        ({"routes": "[{data_source:['*'],reward_models:[]}]"},
         "routes[0] (data_source ['*']) composes 'rubric' (the reward models' score) but scores with no reward "
         "model: list some in its reward_models or drop 'rubric' from its rewards"),
        ({"judge": "{server_url:['http://127.0.0.1:1'],mode:listwise,group_size:4}"},
         "reward_kwargs.judge is set and no reward composition enables 'judge': add it to rewards.components (with a "
         "weight) or drop the judge section"),
        ({"attributes": "{}"}, "reward model 'rm': attributes is empty: name the attributes of its head to use, each "
                               "with its weight, e.g. {helpfulness: 1.0, verbosity: -0.2}"),
        ({"attributes": "{helpfulness:1.0,verbosity:nan}"},
         "reward model 'rm': attribute weights must be finite numbers, got {'verbosity': nan}"),
        ({"attributes": "{helpfulness:1.0}", "step_reward": "min"},
         "reward model 'rm': attributes are read once per response, step_reward per step: an attribute head has no "
         "step scores; drop step_reward or attributes"),
        ({"attributes": "{helpfulness:1.0,verbosity:0.0}", "attribute_alarms": "[{watch:verbosity,against:coherence}]"},
         "attribute_alarms[0] watches 'verbosity' against 'coherence' of reward model 'rm', whose weighted attributes "
         "are ['helpfulness', 'verbosity']: name two different attributes of its attributes (weight 0 reports one "
         "without rewarding it)"),
    ],
    ids=["unknown-option", "bad-type", "bad-policy", "bad-combine", "alpha-range", "chat-template-no-tokenizer",
         "zero-batch", "rubric-and-chat-template", "token-steps-whitened", "token-steps-chat-template",
         "token-steps-rubric", "judge-component-no-section", "token-steps-in-an-ensemble", "rubric-without-an-rm",
         "judge-section-no-component", "attributes-empty", "attributes-nan", "attributes-with-steps",
         "attribute-alarm-unweighted"],
)
def test_bad_options_fail_at_load(load_manager, verl_config, tokenizer, kwargs, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_manager(verl_config("http://127.0.0.1:1", **kwargs), tokenizer)


def test_misrouting_configs_are_reported(load_manager, verl_config, tokenizer):
    cfg = verl_config("http://127.0.0.1:1", "reward_model.reward_manager=vllm_rm", "reward.reward_model.enable=True")
    with pytest.warns(UserWarning) as record:
        load_manager(cfg, tokenizer)
    messages = " ".join(str(w.message) for w in record)
    assert "legacy key" in messages and "reward.reward_manager.name=vllm_rm" in messages
    assert "never call vllm_rm" in messages


def test_rm_names_the_one_reward_model_and_refuses_to_pick_among_several(load_manager, dead_url, verl_config,
                                                                           tokenizer):
    assert load_manager(verl_config(dead_url), tokenizer).rm.name == "rm"
    two = load_manager(verl_config(dead_url, reward_models="[{name:helpful},{name:safety}]"), tokenizer)
    with pytest.raises(AttributeError, match=r"^this run has 2 reward models: use reward_models\[name\]$"):
        two.rm
    assert sorted(two.reward_models) == ["helpful", "safety"]
