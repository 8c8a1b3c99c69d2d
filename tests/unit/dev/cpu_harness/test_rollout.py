"""The hf_cpu rollout of the CPU harness (``dev/cpu_harness/rollout.py``), in this process on the tiny policy: it
samples what verl's actor scores, refuses the settings and weight updates it cannot serve naming the setting, and
pauses for an abort as verl's vLLM server does. (Its replica inside main_ppo: tests/integration/dev/test_tiny_ppo*.)"""

from __future__ import annotations

import pytest
import torch

from verl_vllm_rm.dev.cpu_harness.rollout import _filtered_probs, sample
from verl_vllm_rm.dev.tiny_policy import policy_tokenizer


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
    tokens, log_probs, _ = sample(policy, prompt, 12, stop_ids=set(), temperature=0.7,
                                  generator=torch.Generator().manual_seed(0))
    assert len(tokens) == len(log_probs) == 12
    with torch.no_grad():
        logits = policy(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: -1] / 0.7
    actor = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    assert torch.allclose(actor, torch.tensor(log_probs), atol=1e-5)

def test_greedy_top_k_and_stop(policy, tiny_task):
    prompt = _prompt(tiny_task)
    greedy, _, _ = sample(policy, prompt, 10, stop_ids=set(), temperature=0.0)
    top1, _, _ = sample(policy, prompt, 10, stop_ids=set(), temperature=1.0, top_k=1)
    assert greedy == top1
    stopped, _, _ = sample(policy, prompt, 10, stop_ids={greedy[2]}, temperature=0.0)
    assert stopped == greedy[:3]  # the stop token is kept, nothing after it

def rollout_config(*overrides: str):
    """verl's rollout and model configs of a run with ``rollout.name=hf_cpu`` and ``overrides``, as verl hands them
    to a rollout replica and to the actor's server adapter."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    from verl_vllm_rm.dev.cpu_names import BACKEND_NAME
    from verl_vllm_rm.dev.loader import compose_verl_config

    config = compose_verl_config([f"actor_rollout_ref.rollout.name={BACKEND_NAME}", *overrides]).actor_rollout_ref
    return (omega_conf_to_dataclass(config.rollout),
            omega_conf_to_dataclass(config.model, dataclass_type=HFModelConfig))

def test_a_tensor_parallel_rollout_is_refused_before_any_server_starts(tiny_task):
    import asyncio

    from verl_vllm_rm.dev.cpu_harness.rollout import CPURolloutReplica

    rollout, model = rollout_config(f"actor_rollout_ref.model.path={tiny_task['policy']}",
                                    "actor_rollout_ref.rollout.tensor_model_parallel_size=2")
    replica = CPURolloutReplica(replica_rank=0, config=rollout, model_config=model,
                                gpus_per_node=rollout.n_gpus_per_node)
    with pytest.raises(ValueError, match=r"rollout 'hf_cpu' runs one process per replica: set "
                                         r"actor_rollout_ref.rollout.tensor_model_parallel_size=1"):
        asyncio.run(replica.launch_servers())
    assert replica.servers == []

@pytest.mark.parametrize("update, needle", [
    # what verl's delta_sharded checkpoint engine sends (its module needs cupy: a custom backend could send it here)
    ({"wire_format": "delta_flush"}, r"takes full weights, not 'delta_flush': keep "
                                     r"actor_rollout_ref.rollout.checkpoint_engine.backend at its default"),
    # what verl's actor sends for LoRA without merge (engine_workers.py: peft_config=...)
    ({"peft_config": {"r": 8, "lora_alpha": 16}}, r"takes merged weights: set actor_rollout_ref.model.lora.merge=True"),
], ids=["delta-wire-format", "unmerged-lora"])
def test_weight_updates_the_rollout_cannot_load_are_refused_naming_the_setting(tiny_task, update, needle):
    import asyncio

    from verl_vllm_rm.dev.cpu_harness.rollout import CPUServerAdapter

    rollout, model = rollout_config(f"actor_rollout_ref.model.path={tiny_task['policy']}")
    adapter = CPUServerAdapter(config=rollout, model_config=model, device_mesh=None)
    sent = []

    def weights():
        sent.append("read")
        yield "lm_head.weight", torch.zeros(1)

    with pytest.raises(ValueError, match=rf"rollout 'hf_cpu' {needle}"):
        asyncio.run(adapter.update_weights(weights(), **update))
    assert sent == []  # refused before reading a tensor

@pytest.fixture()
def generation_server(tiny_task):
    """The hf_cpu replica's server class, in this process, with 8 prompt and 4 response tokens (it sets torch's
    threads to 1, as in its own actor: restored after)."""
    from verl_vllm_rm.dev.cpu_harness.rollout import HFGenerationServer

    threads = torch.get_num_threads()
    yield HFGenerationServer(str(tiny_task["policy"]), prompt_length=8, response_length=4)
    torch.set_num_threads(threads)

def test_a_prompt_that_fills_the_context_is_refused_naming_the_lengths(generation_server):
    import asyncio

    out = asyncio.run(generation_server.generate("fits", list(range(10, 21)), {"max_tokens": 4}))
    assert len(out.token_ids) == 1  # 11 of 12 tokens: one left to generate
    with pytest.raises(ValueError, match=r"prompt of 12 tokens leaves no room to generate within 12 tokens "
                                         r"\(data.max_prompt_length \+ max_response_length\): raise "
                                         r"data.max_prompt_length, or drop longer prompts"):
        asyncio.run(generation_server.generate("full", list(range(10, 22)), {"max_tokens": 4}))

def test_a_weight_update_of_another_architecture_is_refused_and_changes_nothing(generation_server):
    before = {name: t.clone() for name, t in generation_server.model.state_dict().items()}
    moved = {name: t + 1 for name, t in before.items()}
    renamed = {("output.weight" if name == "lm_head.weight" else name): t for name, t in moved.items()}
    with pytest.raises(ValueError, match=r"policy weight update does not match the rollout model: missing "
                                         r"\['lm_head.weight'\], unexpected \['output.weight'\]; rollout 'hf_cpu' "
                                         r"loads actor_rollout_ref.model.path as saved"):
        generation_server.load_weights(renamed, global_steps=3)
    after = generation_server.model.state_dict()
    assert generation_server.global_steps is None and all(torch.equal(after[n], t) for n, t in before.items())
    assert generation_server.load_weights(moved, global_steps=3) == len(moved)  # the same tensors, rightly named
    assert generation_server.global_steps == 3 and torch.equal(after["lm_head.weight"], moved["lm_head.weight"])

@pytest.fixture()
def long_generation_server(tiny_task):
    """The hf_cpu server with room for 24 response tokens, its forward passes counted (``calls``) and the third
    announced (``third_pass``: a request is then sampling)."""
    import threading

    from verl_vllm_rm.dev.cpu_harness.rollout import HFGenerationServer

    threads = torch.get_num_threads()
    server = HFGenerationServer(str(tiny_task["policy"]), prompt_length=16, response_length=24)
    server.calls, server.third_pass = 0, threading.Event()
    forward = server.model.forward

    def counted(*args, **kwargs):
        server.calls += 1
        if server.calls == 3:
            server.third_pass.set()
        return forward(*args, **kwargs)

    server.model.forward = counted
    yield server
    torch.set_num_threads(threads)

def test_an_abort_returns_the_tokens_so_far_and_a_resubmission_waits_for_the_resume(long_generation_server):
    """As verl's vLLM server pauses for its asynchronous trainers: the request in flight comes back ``aborted``
    with its tokens and log-probs so far; its resubmission (prompt + those tokens, verl's partial-rollout client)
    waits behind the closed gate, runs on the weights loaded meanwhile, and completes."""
    import asyncio

    server, prompt = long_generation_server, list(range(10, 18))
    params = {"max_tokens": 24, "logprobs": True, "temperature": 0.0}

    async def scenario():
        first = asyncio.create_task(server.generate("r", prompt, params))
        await asyncio.to_thread(server.third_pass.wait)
        await server.abort_all_requests()
        partial = await first
        parked = asyncio.create_task(server.generate("r", prompt + partial.token_ids,
                                                     {**params, "max_tokens": 24 - len(partial.token_ids)}))
        for _ in range(3):
            await asyncio.sleep(0)
        calls_while_closed = server.calls
        server.load_weights(dict(server.model.state_dict()), global_steps=1)
        assert not parked.done() and server.calls == calls_while_closed
        await server.resume_generation()
        return partial, await parked

    partial, rest = asyncio.run(scenario())
    assert partial.stop_reason == "aborted" and 2 <= len(partial.token_ids) < 24
    assert len(partial.log_probs) == len(partial.token_ids) and partial.extra_fields["global_steps"] is None
    assert rest.stop_reason == "completed" and rest.extra_fields["global_steps"] == 1
    whole = asyncio.run(server.generate("again", prompt, params))  # greedy: the two segments are one generation
    assert partial.token_ids + rest.token_ids == whole.token_ids

def test_a_rejecting_abort_answers_new_requests_at_once_until_the_resume(long_generation_server):
    """``abort_all_requests(reject_request=True)`` (a replica leaving rotation, separate_async): a request behind
    the gate gets an empty ``aborted`` answer without a forward pass, for verl's client to send elsewhere."""
    import asyncio

    server = long_generation_server

    async def scenario():
        await server.abort_all_requests(reject_request=True)
        rejected = await server.generate("r", list(range(10, 18)), {"max_tokens": 4})
        calls = server.calls
        await server.resume_generation()
        return rejected, calls, await server.generate("r", list(range(10, 18)), {"max_tokens": 4})

    rejected, calls, served = asyncio.run(scenario())
    assert (rejected.token_ids, rejected.stop_reason, calls) == ([], "aborted", 0)
    assert served.stop_reason == "completed" and len(served.token_ids) >= 1


def test_top_k_and_top_p_keep_the_likeliest_tokens_renormalised():
    """Logits of probabilities 0.5, 0.25, 0.15, 0.1: top_k=2 keeps the first two (2/3, 1/3); top_p=0.6 keeps the
    token that crosses 0.6 (0.5 + 0.25); top_p=0.4 keeps the first alone."""
    logits = torch.log(torch.tensor([0.25, 0.5, 0.1, 0.15]))
    given = logits.clone()
    assert torch.allclose(_filtered_probs(logits, 1.0, -1), torch.tensor([0.25, 0.5, 0.1, 0.15]))
    assert torch.allclose(_filtered_probs(logits, 1.0, 2), torch.tensor([1 / 3, 2 / 3, 0, 0]))
    assert torch.allclose(_filtered_probs(logits, 0.6, -1), torch.tensor([1 / 3, 2 / 3, 0, 0]))
    assert torch.allclose(_filtered_probs(logits, 0.4, -1), torch.tensor([0.0, 1, 0, 0]))
    assert torch.allclose(_filtered_probs(logits, 1.0, 4), torch.tensor([0.25, 0.5, 0.1, 0.15]))  # k = every token
    assert torch.equal(logits, given)  # the filter leaves the caller's logits as they were
