"""The CPU harness: every patch still applies to the installed verl, nothing loads it by accident,
and the hf_cpu rollout samples what verl's actor scores."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from verl_vllm_rm.dev.cpu_harness.rollout import sample
from verl_vllm_rm.dev.tiny_policy import PLAIN_CHAT_TEMPLATE, build_tiny_policy, policy_tokenizer

pytestmark = pytest.mark.server  # imports verl in subprocesses and runs the tiny policy


def _python(code: str, **env: str) -> str:
    import os

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_MODULES"}, **env})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1]


def test_every_patch_still_applies_to_the_installed_verl():
    """A verl upgrade that fixes (or moves) what a patch works around fails here, naming the patch."""
    out = _python("import json, verl_vllm_rm.dev.cpu_harness.activate; "
                  "from verl_vllm_rm.dev.cpu_harness.patches import PATCHES; "
                  "print(json.dumps([[p.name, p.verl_code, p.needed()] for p in PATCHES]))")
    patches = json.loads(out)
    assert len(patches) >= 5
    stale = [f"{name} ({code})" for name, code, needed in patches if not needed]
    assert not stale, f"these harness patches no longer apply to the installed verl: {stale}"


def test_the_harness_registers_cpu_and_the_rollout_backend():
    out = _python(
        "import json, torch.distributed as d, verl_vllm_rm.dev.cpu_harness.activate; "
        "from verl.utils.device import get_device_name, get_nccl_backend; "
        "from verl.workers.rollout.replica import RolloutReplicaRegistry; "
        "from verl.workers.rollout.base import get_rollout_class; "
        "print(json.dumps([get_device_name(), get_nccl_backend(), RolloutReplicaRegistry.get('hf_cpu').__name__, "
        "get_rollout_class('hf_cpu', 'async').__name__, d.init_process_group._vrm_dedupe]))")
    assert json.loads(out) == ["cpu", "gloo", "CPURolloutReplica", "CPUServerAdapter", True]


def test_plugin_and_verl_never_load_the_harness():
    """The plugin's normal path (entry point, manager) leaves verl's platforms and torch untouched."""
    out = _python("import sys, json, verl, verl_vllm_rm.plugin.register, verl_vllm_rm.scoring.manager; "
                  "from verl.plugin.platform.platform_manager import PlatformRegistry; "
                  "print(json.dumps(['verl_vllm_rm.dev.cpu_harness.activate' in sys.modules, "
                  "PlatformRegistry.get('cpu')]))")
    assert json.loads(out) == [False, None]


def test_backend_string_dedupe():
    from verl_vllm_rm.dev.cpu_harness.patches import _dedupe_backends

    assert _dedupe_backends("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert _dedupe_backends("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert _dedupe_backends("gloo") == "gloo" and _dedupe_backends(None) is None


@pytest.fixture(scope="module")
def policy(tiny_task):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_task["policy"], dtype=torch.float32).eval()


def _prompt(tiny_task) -> list[int]:
    tokenizer = policy_tokenizer(tiny_task["policy"])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4? Please compute the sum."}],
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def test_sampled_log_probs_are_what_the_actor_computes(policy, tiny_task):
    """log p(token) of the temperature-scaled distribution, as verl's actor recomputes it."""
    prompt = _prompt(tiny_task)
    tokens, log_probs = sample(policy, prompt, 12, stop_ids=set(), temperature=0.7,
                               generator=torch.Generator().manual_seed(0))
    assert len(tokens) == len(log_probs) == 12
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1] / 0.7
    actor = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    assert torch.allclose(actor, torch.tensor(log_probs), atol=1e-5)


def test_greedy_top_k_and_stop(policy, tiny_task):
    prompt = _prompt(tiny_task)
    greedy, _ = sample(policy, prompt, 10, stop_ids=set(), temperature=0.0)
    top1, _ = sample(policy, prompt, 10, stop_ids=set(), temperature=1.0, top_k=1)
    assert greedy == top1
    stopped, _ = sample(policy, prompt, 10, stop_ids={greedy[2]}, temperature=0.0)
    assert stopped == greedy[:3]  # the stop token is kept, nothing after it


def test_policy_on_an_rm_tokenizer_without_chat_template(tmp_path, tiny_rm):
    """input_format=token_ids needs the RM's ids: the policy keeps its tokenizer, adding a plain template."""
    from transformers import AutoTokenizer

    rm_dir = tmp_path / "rm"
    tokenizer = AutoTokenizer.from_pretrained(tiny_rm)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(rm_dir)
    (rm_dir / "chat_template.jinja").unlink(missing_ok=True)
    from verl_vllm_rm.dev.tiny_policy import SFTWarmUp, TinyPolicySpec

    out = build_tiny_policy(rm_dir, tmp_path / "policy", TinyPolicySpec(sft=SFTWarmUp(steps=2)))
    policy_tok = AutoTokenizer.from_pretrained(out)
    assert policy_tok.chat_template == PLAIN_CHAT_TEMPLATE
    assert policy_tok("The answer is 7. #### 7").input_ids == tokenizer("The answer is 7. #### 7").input_ids


def test_importing_the_harness_modules_changes_nothing():
    """Only ``activate`` patches: this test session imported the rollout and the patch list above, and
    an activated harness here would hand VERL_PLATFORM=cpu to every later Ray worker of the suite."""
    import os

    import verl_vllm_rm.dev.cpu_harness.patches  # noqa: F401

    assert "verl_vllm_rm.dev.cpu_harness.activate" not in sys.modules
    assert "VERL_PLATFORM" not in os.environ and "VERL_ENGINE_DEVICE" not in os.environ
