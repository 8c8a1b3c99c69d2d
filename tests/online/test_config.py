"""``+online_rm.*`` options of the engine-based RM trainer: wrong values are refused naming the option and the fix."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from verl_vllm_rm.online.config import OnlineRMConfig, RMEngineOptions, RMModelOptions, RMOptimizerOptions

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
