"""How a fresh verl process finds ``vllm_rm``: ``import verl`` loads the ``verl.plugins`` entry point, unless
``VERL_USE_EXTERNAL_PLUGINS=none`` (docs/troubleshooting.md's cause of ``Unknown reward manager: vllm_rm`` in Ray
workers).

Each case runs in a new interpreter, as a Ray reward-loop worker does: nothing from this package is
imported before verl looks the name up in its reward-loop registry.
"""

import json
import os
import subprocess
import sys

import pytest

from verl_vllm_rm.parity.reference import sequence_scores


WORKER = """
import json, sys
import verl  # what every Ray worker does first: loads the verl.plugins entry points
from verl.experimental.reward_loop.reward_manager.registry import get_reward_manager_cls

try:
    cls = get_reward_manager_cls("vllm_rm")
except ValueError as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from verl_vllm_rm.dev.grpo_batch import Group, build_batch

url, model = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(model)
config = OmegaConf.create({"reward": {"reward_kwargs": {"server_url": url, "max_length": 512, "num_examine": 0}}})
manager = cls(config, tok, None)
data = build_batch([Group(tok("What is 3 + 4?").input_ids, [tok(" The answer is 7.", add_special_tokens=False).input_ids])],
                   tok.pad_token_id)
out = manager.loop.run_until_complete(manager.run_single(data[0:1]))
print(json.dumps({"class": f"{cls.__module__}.{cls.__name__}", "score": out["reward_score"]}))
"""


def fresh_worker(url: str, model: str, policy: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL_")}
    if policy is not None:
        env["VERL_USE_EXTERNAL_PLUGINS"] = policy
    proc = subprocess.run([sys.executable, "-c", WORKER, url, model], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_point_registers_the_manager_in_a_fresh_process(rm_server, tiny_rm, tokenizer, hf_model):
    """By default (no ``VERL_USE_EXTERNAL_PLUGINS``) the name is found through verl's registry alone, and the
    class scores a row like transformers on the real server."""
    out = fresh_worker(rm_server.url, tiny_rm, None)
    assert out.get("class") == "verl_vllm_rm.scoring.manager.VLLMRewardManager", out
    ids = tokenizer("What is 3 + 4?").input_ids + tokenizer(" The answer is 7.", add_special_tokens=False).input_ids
    assert out["score"] == pytest.approx(sequence_scores(hf_model, [ids])[0], abs=1e-4)


def test_plugins_off_means_unknown_reward_manager(rm_server, tiny_rm):
    """``VERL_USE_EXTERNAL_PLUGINS=none``: verl skips the entry point and the name is unknown, as
    docs/troubleshooting.md says."""
    assert fresh_worker(rm_server.url, tiny_rm, "none") == {"error": "Unknown reward manager: vllm_rm"}
