"""Trainer mode ``vllm_rm_online`` (``plugin/online_mode.py``) with verl's own pieces, around a PPO step: the
in-process tests (no server; those on the real server: tests/integration/plugin/test_online_mode.py)."""

from __future__ import annotations
import pytest
from verl_vllm_rm.options import ConfigError


def test_trainer_without_online_rm_options_names_them(compose_config):
    from verl_vllm_rm.plugin.online_mode import build_online_rm

    with pytest.raises(ValueError, match=r"online_rm section.*\+online_rm.model_path"):
        build_online_rm(compose_config(["trainer.v1.trainer_mode=vllm_rm_online"]))


@pytest.mark.parametrize("reward_url, expected", [
    (None, ["http://127.0.0.1:8001"]),  # the manager's own default
    ("http://rm-host:9000", ["http://rm-host:9000"]),
    ("[http://rm-host:9000]", ["http://rm-host:9000"]),
    ("[http://a:1,http://b:2]", ["http://a:1", "http://b:2"]),  # every server the manager routes over
])
def test_online_rm_publishes_to_the_reward_managers_servers_by_default(compose_config, reward_url, expected):
    from verl_vllm_rm.plugin.online_mode import online_rm_config

    overrides = ["+online_rm.model_path=/rm"] + ([f"+reward.reward_kwargs.server_url={reward_url}"] if reward_url else [])
    online = online_rm_config(compose_config(overrides))
    assert online.server_url == expected and online.on_server_failure is None  # a failed server aborts the version
    explicit = compose_config([*overrides, "+online_rm.server_url=http://other:1"])
    assert online_rm_config(explicit).server_url == ["http://other:1"]


def test_on_server_failure_is_for_a_fixed_list_and_names_its_two_choices(compose_config):
    from verl_vllm_rm.plugin.online_mode import online_rm_config

    fixed = ["+online_rm.model_path=/rm", "+reward.reward_kwargs.server_url=[http://a:1,http://b:2]"]
    assert online_rm_config(compose_config([*fixed, "+online_rm.on_server_failure=leave_behind"])
                            ).on_server_failure == "leave_behind"
    with pytest.raises(ValueError, match=r"online_rm.on_server_failure.*one of \['abort', 'leave_behind'\]"):
        online_rm_config(compose_config([*fixed, "+online_rm.on_server_failure=skip"]))
    managed = ["+online_rm.model_path=/rm", "reward.reward_manager.name=vllm_rm",
               "+reward.reward_kwargs.replicas={model:/rm,num_replicas:2}", "+online_rm.on_server_failure=abort"]
    with pytest.raises(ValueError, match=r"online_rm.on_server_failure='abort' decides what a fixed server_url list "
                                         r"does .* the managed replicas of reward_model always leave it behind .*: "
                                         r"drop on_server_failure"):
        online_rm_config(compose_config(managed))


def test_online_rm_with_managed_replicas_publishes_to_every_replica_of_the_rm(compose_config):
    from verl_vllm_rm.plugin.online_mode import online_rm_config

    managed = ["+online_rm.model_path=/rm", "reward.reward_manager.name=vllm_rm",
               "+reward.reward_kwargs.replicas={model:/rm,num_replicas:2}"]
    online = online_rm_config(compose_config(managed))
    assert online.reward_model == "rm" and online.server_url is None
    with pytest.raises(ValueError, match=r"online_rm.reward_model='safety' is not a reward model on managed replicas "
                                         r"\(this run's: \['rm'\]\): name one of them, or set online_rm.server_url"):
        online_rm_config(compose_config([*managed, "+online_rm.reward_model=safety"]))
    both = compose_config(["+online_rm.model_path=/rm", "+online_rm.server_url=http://a:1",
                           "+online_rm.reward_model=safety"])
    with pytest.raises(ValueError, match=r"exactly one of server_url \(the servers\) and reward_model"):
        online_rm_config(both)


SCALAR_ONLY = ("; online_rm trains a reward model with a scalar or two-class head (*ForSequenceClassification, "
               "num_labels=1 or 2). Serve this one without online training (drop "
               "trainer.v1.trainer_mode=vllm_rm_online), or train a scalar RM")


@pytest.mark.parametrize("config, reason", [
    ({"architectures": ["Qwen2ForRewardModel"]},
     "Qwen2ForRewardModel has no transformers class (its modeling code ships with the published checkpoint), so "
     "verl's engine cannot load it to train"),
    ({"architectures": ["InternLM2ForRewardModel"], "model_type": "internlm2",
      "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config"}},
     "InternLM2ForRewardModel has no transformers class (its modeling code ships with the published checkpoint), so "
     "verl's engine cannot load it to train"),
    ({"architectures": ["Qwen2ForProcessRewardModel"], "id2label": {"0": "negative", "1": "positive"}},
     "Qwen2ForProcessRewardModel has no transformers class (its modeling code ships with the published checkpoint), "
     "so verl's engine cannot load it to train"),
    ({"architectures": ["MistralForCausalLM"]},
     "MistralForCausalLM is not a sequence classifier (a process reward model read at step tags, or a causal LM): "
     "preference pairs rank whole responses by one reward"),
    ({"architectures": ["Qwen2ForSequenceClassification"], "problem_type": "regression",
      "id2label": {"0": "helpfulness", "1": "verbosity"}},
     "Qwen2ForSequenceClassification has 2 attribute outputs and preference pairs train one reward; there is no "
     "single reward to train"),
    ({"architectures": ["LlamaForSequenceClassification"], "problem_type": "regression",
      "id2label": {str(i): name for i, name in enumerate("abcde")}},
     "LlamaForSequenceClassification has 5 attribute outputs and preference pairs train one reward; there is no "
     "single reward to train"),
], ids=["qwen2-rm", "internlm2-rm", "qwen2-prm", "causal-lm", "two-regression-outputs", "attributes"])
def test_online_training_refuses_a_head_it_cannot_train_at_start_up(compose_config, tmp_path, config, reason):
    import json

    from verl_vllm_rm.plugin.online_mode import online_rm_config

    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as refused:
        online_rm_config(compose_config([f"+online_rm.model_path={tmp_path}"]))
    assert str(refused.value) == f"online_rm.model_path={tmp_path}: {reason}{SCALAR_ONLY}"


@pytest.mark.parametrize("step, total, rollout_skip, early", [
    (1, 3, False, True),  # the next step's prompts go to the rollout before this step's RM step
    (2, 3, False, True),
    (3, 3, False, False),  # the last step: there is no next one
    (4, 3, False, False),
    (1, 3, True, False),  # verl's rollout skip keys a submission by the step making it: the next step submits its own
])
def test_the_next_steps_prompts_are_submitted_early_but_after_the_last_step_and_under_rollout_skip(
        step, total, rollout_skip, early):
    from verl_vllm_rm.plugin.online_mode import submits_next_batch_early

    assert submits_next_batch_early(step, total, rollout_skip) is early
