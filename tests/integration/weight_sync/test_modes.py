"""Each training mode end to end: BT steps on the tiny RM, a publish after each, exact parity."""

from __future__ import annotations

import pytest
import requests
import torch
from sync_helpers import assert_parity, load_rm, max_diff, reset_server, runtime_version

from verl_vllm_rm.weight_sync import RewardModelPublisher
from verl_vllm_rm.dev.offline_bt import OfflineBradleyTerry
from verl_vllm_rm.online.trainable import prepare_reward_model

STEPS = 3
# What each mode must send for the tiny Qwen2 RM (2 layers): the head; with the server's LoRA base store
# (the default) the head plus lora_A and lora_B of the 7 adapted linears a layer; merged LoRA, the head plus
# every adapted linear with its fused siblings and biases (10 tensors a layer); everything.
EXPECTED_PARAMS = {("head_only", "auto"): 1, ("lora", "auto"): 29, ("lora", "merged"): 21, ("full", "auto"): 27}


@pytest.mark.parametrize("mode, lora_wire", list(EXPECTED_PARAMS))
def test_bt_steps_publish_and_score_like_the_trainer(mode, lora_wire, ws_server, tiny_rm, probe_ids,
                                                     preference_batch):
    reset_server(ws_server.url, tiny_rm)
    model = prepare_reward_model(load_rm(tiny_rm), mode, lora_rank=4, lora_alpha=8)
    trainer = OfflineBradleyTerry(model, lr=5e-3)
    previous = assert_parity(ws_server.url, model, probe_ids)
    with RewardModelPublisher(ws_server.url, timeout_s=60, bucket_bytes=256 << 10, lora_wire=lora_wire) as pub:
        for _ in range(STEPS):
            version = runtime_version(ws_server.url) + 1
            trainer.step(preference_batch)
            result = pub.publish(model, version, mode)
            assert result.num_params == EXPECTED_PARAMS[mode, lora_wire]
            assert result.lora_adapters == (mode == "lora" and lora_wire == "auto")
            assert runtime_version(ws_server.url) == version
            # every /score answer names the weights that computed it
            assert requests.post(f"{ws_server.url}/score", json={"input": probe_ids[:1]},
                                 timeout=60).json()["version"] == version
            scores = assert_parity(ws_server.url, model, probe_ids)
            assert max_diff(scores, previous) > 1e-3, "the step did not change the served scores"
            previous = scores


def test_lora_publish_leaves_the_training_model_alone(ws_server, tiny_rm, probe_ids, preference_batch):
    from peft import PeftModel

    reset_server(ws_server.url, tiny_rm)
    model = prepare_reward_model(load_rm(tiny_rm), "lora", lora_rank=4, lora_alpha=8)
    base_q = model.get_parameter("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")
    base_before = base_q.detach().clone()
    lora_b = model.get_parameter("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight")
    trainer = OfflineBradleyTerry(model, lr=5e-3)
    with RewardModelPublisher(ws_server.url, timeout_s=60) as pub:
        for _ in range(2):
            trainer.step(preference_batch)
            pub.publish(model, runtime_version(ws_server.url) + 1, "lora")
            assert isinstance(model, PeftModel) and not any(m.merged for m in _lora_layers(model))
            assert torch.equal(base_q, base_before), "publishing merged the adapters into the base weights"
            after_publish = lora_b.detach().clone()
            assert after_publish.abs().sum() > 0
            trainer.step(preference_batch)
            assert not torch.equal(lora_b, after_publish), "the adapters stopped training after a publish"
            pub.publish(model, runtime_version(ws_server.url) + 1, "lora")
            assert_parity(ws_server.url, model, probe_ids)


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]
