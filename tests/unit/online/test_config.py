"""``+online_rm.*`` options of the engine-based RM trainer (``online/config.py``): wrong values are refused naming the
option and the fix, and the online recipe's options are valid."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest
from repo_paths import REPO

from verl_vllm_rm.online.config import OnlineRMConfig, RMEngineOptions, RMModelOptions, RMOptimizerOptions
from verl_vllm_rm.options import ConfigError

BASE = {"model_path": "/rm", "server_url": "http://rm:1"}


@pytest.mark.parametrize(("option", "value", "message"), [
    ("param_dtype", "bf17", r"online_rm.param_dtype='bf17' is not one of \['bf16', 'fp16', 'fp32'\]"),
    ("strategy", "ddp", r"online_rm.strategy='ddp' is not one of \['fsdp', 'fsdp2'\]"),
    ("placement", "actor", r"online_rm.placement='actor' is not one of \['separate', 'colocated'\]"),
    ("lora_wire", "both", r"online_rm.lora_wire='both' is not one of \['auto', 'adapters', 'merged'\]"),
    ("lora_wire", "adapters", r"online_rm.lora_wire='adapters' decides what a LoRA publish sends, and "
                              r"training_mode is head_only: drop lora_wire or train with training_mode=lora"),
    ("micro_batch_size_per_gpu", 0, r"online_rm: micro_batch_size_per_gpu must be >= 1, got 0"),
    ("num_workers", 0, r"online_rm: num_workers must be >= 1, got 0"),
    ("lr", 0.0, r"online_rm: lr must be > 0, got 0.0"),
    ("placement_timeout_s", 0, r"online_rm: placement_timeout_s must be > 0, got 0"),
    ("fsdp_size", 0, r"online_rm: fsdp_size must be -1 \(all RM ranks\) or >= 1, got 0"),
    ("max_grad_norm", 1.0, r"unknown online_rm option\(s\) \['max_grad_norm'\]; valid options are: .*clip_grad"),
])
def test_a_wrong_engine_option_names_itself_and_what_it_takes(option, value, message):
    with pytest.raises(ValueError, match=message):
        OnlineRMConfig.from_dict({**BASE, option: value})


def test_options_reach_verls_engine_config_under_verls_names(tiny_rm):
    base = {**BASE, "model_path": tiny_rm}  # verl's model config reads the checkpoint's config
    config = OnlineRMConfig.from_dict({**base, "training_mode": "lora", "param_dtype": "fp32", "param_offload": True,
                                       "micro_batch_size_per_gpu": 2, "clip_grad": 0.5, "target_modules": ["q_proj"]})
    worker = config.training_worker_config()
    assert worker.model_type == "reward_model"
    assert worker.engine_config.mixed_precision == {"param_dtype": "fp32"} and worker.engine_config.model_dtype == "fp32"
    assert (worker.engine_config.param_offload, worker.engine_config.micro_batch_size_per_gpu) == (True, 2)
    assert (worker.optimizer_config.clip_grad, worker.model_config.lora_rank) == (0.5, 8)
    assert list(worker.model_config.target_modules) == ["q_proj"]
    full = OnlineRMConfig.from_dict({**base, "training_mode": "full"}).training_worker_config()
    assert full.model_config.lora_rank == 0 and full.engine_config.mixed_precision == {"param_dtype": "bf16"}


def test_the_attention_is_flash_attention_where_it_imports_else_sdpa_and_padding_removal_follows(tiny_rm, caplog):
    """``auto`` (the default) resolves in the trainer's process; ``use_remove_padding`` unset follows it. This
    machine has no flash_attn (the CPU environment), so the default is sdpa without padding removal, and naming
    flash_attention_2 is refused here, not at each rank's load."""
    import logging

    from verl_vllm_rm.online.config import flash_attn_imports, resolve_attention

    assert resolve_attention("auto", lambda: True) == "flash_attention_2"
    assert resolve_attention("auto", lambda: False) == "sdpa"
    assert resolve_attention("eager", lambda: False) == "eager"
    assert resolve_attention("flash_attention_2", lambda: True) == "flash_attention_2"
    assert not flash_attn_imports()
    base = {**BASE, "model_path": tiny_rm}
    with caplog.at_level(logging.INFO, logger="verl_vllm_rm.online.config"):
        model = OnlineRMConfig.from_dict(base).training_worker_config().model_config
    assert (model.override_config["attn_implementation"], model.use_remove_padding) == ("sdpa", False)
    assert "online_rm.attn_implementation=auto: the RM uses sdpa (flash_attn does not import)" in caplog.text
    kept = OnlineRMConfig.from_dict({**base, "use_remove_padding": True}).training_worker_config().model_config
    assert kept.use_remove_padding is True  # as the user set it
    refusal = ("online_rm.attn_implementation=flash_attention_2 needs the flash_attn package, which does not import "
               "in this environment: install it (pip install flash-attn --no-build-isolation, see docs/quickstart.md), "
               "or set attn_implementation=auto (sdpa without it) or sdpa")
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        OnlineRMConfig.from_dict({**base, "attn_implementation": "flash_attention_2"}).training_worker_config()


def test_colocated_placement_needs_the_actors_pool():
    from verl_vllm_rm.online.driver import OnlineRewardModel

    with pytest.raises(ValueError, match="online_rm.placement=colocated needs the actor's resource pool"):
        OnlineRewardModel(OnlineRMConfig.from_dict({**BASE, "placement": "colocated"}))


@pytest.mark.parametrize("section", [RMOptimizerOptions, RMModelOptions, RMEngineOptions])
def test_each_engine_section_is_fields_of_the_verl_config_it_names(section):
    """A section is handed to verl's dataclass as it is (``training_worker_config``): every name must be that
    dataclass's own field, so a verl that renames one fails here rather than in a run."""
    module, name = section.VERL_CONFIG.rsplit(".", 1)
    verl_fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name)) if f.init}
    ours = {f.name for f in dataclasses.fields(section)}
    assert ours <= verl_fields, sorted(ours - verl_fields)


def test_online_rm_recipe_options_are_valid(compose_config):
    import os
    import subprocess

    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.plugin.online_mode import online_rm_config

    recipe = REPO / "recipes" / "grpo_math_online_rm.sh"
    env = dict(os.environ, VERL_VLLM_RM_DRY_RUN="1", RM_PATH="/models/rm")
    overrides = subprocess.run(["bash", str(recipe)], env=env, capture_output=True, text=True,
                               check=True).stdout.splitlines()
    assert "trainer.v1.trainer_mode=vllm_rm_online" in overrides
    config = online_rm_config(compose_config(overrides))
    assert (config.model_path, config.training_mode, config.reward_key) == ("/models/rm", "lora", ["verifiable_score"])
    assert config.server_url == ["http://127.0.0.1:8001"], "the reward manager's server (the recipe's RM_URL)"
    with pytest.raises(ValueError, match="valid options"):
        OnlineRMConfig.from_dict({"model_path": "/models/rm", "server_url": "http://x", "learning_rate": 1e-5})


def test_online_rm_options_are_checked():
    with pytest.raises(ConfigError, match=r"^online_rm: online_rm needs exactly one of server_url \(the servers\) and "
                                          r"reward_model \(the managed replicas of that RM\)"):
        OnlineRMConfig.from_dict({"model_path": "rm"})
    with pytest.raises(ConfigError, match=r"^missing required online_rm option\(s\) \['model_path'\]"):
        OnlineRMConfig.from_dict({"server_url": "http://rm"})
    with pytest.raises(ConfigError, match=r"^online_rm\.lr must be a number, got '1e-5'$"):
        OnlineRMConfig.from_dict({"model_path": "rm", "server_url": "http://rm", "lr": "1e-5"})
    with pytest.raises(ConfigError, match=r"^online_rm: publish_every must be >= 1, got 0$"):
        OnlineRMConfig.from_dict({"model_path": "rm", "server_url": "http://rm", "publish_every": 0})
    with pytest.raises(ConfigError, match=r"^online_rm: max_idle_steps must be >= 0, got -1$"):
        OnlineRMConfig.from_dict({"model_path": "rm", "server_url": "http://rm", "max_idle_steps": -1})
    assert OnlineRMConfig.from_dict({"model_path": "rm", "server_url": "http://rm"}).max_idle_steps == 10
