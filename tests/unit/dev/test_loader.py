"""Loading ``vllm_rm`` as a verl run does (``dev/loader.py``): values written in Hydra's override grammar, the
overrides that select ``vllm_rm``, and verl's own ``ppo_trainer`` config composed with them."""

from __future__ import annotations

from omegaconf import OmegaConf

from verl_vllm_rm.dev.loader import compose_verl_config, hydra_value, vllm_rm_config, vllm_rm_overrides


def test_values_are_written_in_hydras_grammar():
    assert [hydra_value(v) for v in (True, False, None, 3, 0.25, "token_ids")] == [
        "true", "false", "null", "3", "0.25", "token_ids"]
    assert hydra_value([1, "a", None]) == "[1,a,null]" and hydra_value((2, 3)) == "[2,3]"
    assert hydra_value({"mode": "pairwise", "weights": {"rm": 1.0, "format": [0, True]}}) == (
        "{mode:pairwise,weights:{rm:1.0,format:[0,true]}}")


def test_the_overrides_select_vllm_rm_on_the_server_with_its_kwargs():
    assert vllm_rm_overrides("http://127.0.0.1:8000", "/m/rm", {"alpha": 0.5, "judge": None}) == [
        "reward.reward_manager.name=vllm_rm",
        "actor_rollout_ref.model.path=/m/rm",
        "+reward.reward_kwargs.server_url=http://127.0.0.1:8000",
        "+reward.reward_kwargs.alpha=0.5",
        "+reward.reward_kwargs.judge=null",
    ]
    assert not [o for o in vllm_rm_overrides(None, "/m/rm") if "server_url" in o]  # the options say where


def test_the_composed_config_carries_every_kwarg_as_given():
    kwargs = {"alpha": 0.5, "normalize": True, "judge": None, "rule_weights": {"format": 0.2, "ngram": [1, 2]}}
    config = vllm_rm_config("http://127.0.0.1:8000", "/m/rm", kwargs, ["trainer.total_training_steps=7"])
    assert config.reward.reward_manager.name == "vllm_rm" and config.actor_rollout_ref.model.path == "/m/rm"
    assert OmegaConf.to_container(config.reward.reward_kwargs) == {"server_url": "http://127.0.0.1:8000", **kwargs}
    assert config.trainer.total_training_steps == 7


def test_with_no_override_the_config_is_verls_ppo_trainer():
    config = compose_verl_config()
    assert config.algorithm.adv_estimator == "gae" and config.reward.reward_manager.name == "naive"
