"""``actor_rollout_ref.rollout.name=hf_cpu``: a rollout backend verl 0.9.1 can drive on CPU.

verl's main_ppo only starts rollout replicas registered in
``verl/workers/rollout/replica.py`` (``RolloutReplicaRegistry``: vllm, sglang,
trtllm), and each needs its engine importable next to verl. This backend is a
transformers copy of the policy in one Ray actor per replica:

* :class:`HFGenerationServer` (the replica's "server"): token ids in, sampled token
  ids and their log-probabilities out (``generate``, as verl's agent loop calls
  vLLM's server), and ``load_weights`` for the actor's new weights. It pauses as
  vLLM's server does for verl's asynchronous trainers (``abort_all_requests``: the
  requests in flight return the tokens so far as ``aborted``, and verl's client
  resubmits them, parked until ``resume_generation``), so partial rollouts happen
  on CPU too.
* :class:`CPURolloutReplica`: starts that actor where verl starts a vLLM server.
* :class:`CPUServerAdapter`: lives in each actor worker (verl's hybrid engine) and
  hands the tensors of verl's ``naive`` weight sync to its replica's server after
  every PPO step.

verl's own ``HFRollout`` (``verl/workers/rollout/hf_rollout.py``) generates whole
padded batches without log-probabilities from an FSDP module in the same process;
the agent loop needs one request at a time, so sampling here is a short loop of
its own over the model's KV cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any, Callable, Generator, NamedTuple

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

from verl_vllm_rm.dev.cpu_names import BACKEND_NAME, GENERATION_LOG_ENV, ROLLOUT_TOKEN_DELAY_ENV



def server_name(replica_rank: int) -> str:
    return f"hf_cpu_rollout_server_{replica_rank}"


class Sampled(NamedTuple):
    tokens: list[int]
    log_probs: list[float]
    aborted: bool  # stopped by ``aborted()`` before a stop id or ``max_tokens``


def never() -> bool:
    return False


@torch.no_grad()
def sample(model: torch.nn.Module, prompt_ids: list[int], max_tokens: int, stop_ids: set[int],
           temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
           generator: torch.Generator | None = None, aborted: Callable[[], bool] = never) -> Sampled:
    """Sample up to ``max_tokens`` tokens after ``prompt_ids`` (stopping after a stop id, or, with what was
    sampled so far, as soon as ``aborted()`` says so: checked before each forward pass).

    Log-probabilities are those of the temperature-scaled distribution, which is
    what verl's actor computes for the same tokens (``logits / temperature``).
    ``temperature == 0`` is greedy.
    """
    tokens: list[int] = []
    log_probs: list[float] = []
    if aborted():
        return Sampled(tokens, log_probs, True)
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    for _ in range(max_tokens):
        logits = out.logits[0, -1].float()
        scaled = logits / temperature if temperature > 0 else logits
        logp = torch.log_softmax(scaled, dim=-1)
        if temperature <= 0:
            token = int(torch.argmax(logits))
        else:
            token = int(torch.multinomial(_filtered_probs(scaled, top_p, top_k), 1, generator=generator))
        tokens.append(token)
        log_probs.append(float(logp[token]))
        if token in stop_ids or len(tokens) == max_tokens:
            break
        if aborted():
            return Sampled(tokens, log_probs, True)
        out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return Sampled(tokens, log_probs, False)


def _filtered_probs(scaled_logits: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    logits = scaled_logits.clone()
    if 0 < top_k < logits.numel():
        logits[logits < torch.topk(logits, top_k).values[-1]] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) > top_p  # keep the token that crosses top_p
        logits[order[drop]] = float("-inf")
    return torch.softmax(logits, dim=-1)


class HFGenerationServer:
    """One replica's policy copy (a Ray actor): generates one request at a time.

    Its admission gate mirrors verl's vLLM server (``vllm_async_server.py``: ``abort_all_requests``,
    ``_park_until_admitted``, ``resume_generation``): an abort closes the gate and stops every request admitted
    before it at its next token (each request remembers the abort count it was admitted under); requests that
    arrive behind the closed gate wait for ``resume_generation``, or, when the abort rejects them (a replica
    leaving rotation), get an empty ``aborted`` answer at once.
    """

    def __init__(self, model_path: str, prompt_length: int, response_length: int, seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        torch.set_num_threads(1)  # the actor and reward server share a couple of cores
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        eos = GenerationConfig.from_model_config(self.model.config).eos_token_id
        self.stop_ids = {tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else (eos or []))} - {None}
        self.max_model_len = prompt_length + response_length
        self.response_length = response_length
        self.generator = torch.Generator().manual_seed(seed)
        self.global_steps: int | None = None
        self.lock = threading.Lock()
        self.log_path = os.environ.get(GENERATION_LOG_ENV)
        self.aborts = 0  # abort_all_requests calls so far
        self.token_delay_s = float(os.environ.get(ROLLOUT_TOKEN_DELAY_ENV) or 0.0)
        self.rejecting = False
        self._gate: asyncio.Event | None = None  # set: admitting; made on the actor's event loop

    def admission_gate(self) -> asyncio.Event:
        if self._gate is None:
            self._gate = asyncio.Event()
            self._gate.set()
        return self._gate

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **_multimodal: Any) -> TokenOutput:
        gate = self.admission_gate()
        while not gate.is_set():
            if self.rejecting:
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                                   extra_fields={"global_steps": self.global_steps})
            await gate.wait()
        return await asyncio.to_thread(self._generate, list(prompt_ids), dict(sampling_params), self.aborts)

    def _generate(self, prompt_ids: list[int], params: dict[str, Any], admitted_at: int) -> TokenOutput:
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room to generate within "
                             f"{self.max_model_len} tokens (data.max_prompt_length + max_response_length): raise "
                             "data.max_prompt_length, or drop longer prompts with data.filter_overlong_prompts=True")
        max_tokens = max(1, min(params.get("max_tokens", self.response_length), room))
        top_k = params.get("top_k", -1)
        with self.lock:
            start = time.time()
            sampled = sample(self.model, prompt_ids, max_tokens, self.stop_ids,
                             temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                             top_k=-1 if top_k is None else int(top_k), generator=self.generator,
                             aborted=lambda: self._stops(admitted_at))
            stop_reason = "aborted" if sampled.aborted else "completed"
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps({"version": self.global_steps, "prompt_ids": prompt_ids,
                                        "response_ids": sampled.tokens, "stop_reason": stop_reason,
                                        "start": start, "end": time.time()}) + "\n")
        return TokenOutput(token_ids=sampled.tokens, log_probs=sampled.log_probs if params.get("logprobs") else None,
                           stop_reason=stop_reason, extra_fields={"global_steps": self.global_steps})

    def _stops(self, admitted_at: int) -> bool:
        """Asked before each forward pass: whether an abort came since the request was admitted (after the
        slowed rollout's wait, when one is set)."""
        if self.token_delay_s:
            time.sleep(self.token_delay_s)
        return self.aborts != admitted_at

    def load_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the actor's full weights (HF names); returns how many tensors were loaded."""
        with self.lock:
            # Checked before loading, so a refused update leaves the model as it was.
            names = self.model.state_dict().keys()
            # Tied embeddings arrive once; anything else missing means a wrong or partial update.
            missing = [n for n in names if n not in state_dict
                       and not (n == "lm_head.weight" and self.model.config.tie_word_embeddings)]
            unexpected = [n for n in state_dict if n not in names]
            if missing or unexpected:
                raise ValueError(f"policy weight update does not match the rollout model: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}; rollout {BACKEND_NAME!r} loads "
                                 "actor_rollout_ref.model.path as saved, so the actor must train that same "
                                 "architecture under its Hugging Face names")
            self.model.load_state_dict(state_dict, strict=False)
            self.global_steps = global_steps
        return len(state_dict)

    # Lifecycle calls verl makes on every rollout server; a CPU copy has no device memory to free.
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """Close the gate and stop the requests in flight at their next token; returns once none is sampling."""
        self.admission_gate().clear()
        self.rejecting = reject_request
        self.aborts += 1
        await asyncio.to_thread(self._wait_for_sampling_to_stop)

    def _wait_for_sampling_to_stop(self) -> None:
        with self.lock:
            pass

    async def resume_generation(self) -> None:
        self.rejecting = False
        self.admission_gate().set()

    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


class CPURolloutReplica(RolloutReplica):
    """Starts the replica's :class:`HFGenerationServer` where verl would start a vLLM server."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(f"rollout {BACKEND_NAME!r} runs one process per replica: set "
                             "actor_rollout_ref.rollout.tensor_model_parallel_size=1 (and data/pipeline parallel 1)")
        actor = ray.remote(HFGenerationServer).options(
            name=server_name(self.replica_rank), num_cpus=1, max_concurrency=self.max_concurrency,
        ).remote(self.model_config.get("local_path") or self.model_config.path, self.config.prompt_length, self.config.response_length,
                 self.config.seed + self.replica_rank)
        self.servers = [actor]
        self._server_handle = actor
        self._server_address = f"{BACKEND_NAME}-replica-{self.replica_rank}"


class CPUServerAdapter(BaseRollout):
    """The actor worker's side of the weight sync: sends its full weights to its replica's server."""

    def __init__(self, config, model_config, device_mesh=None, *args, **kwargs) -> None:
        super().__init__(config, model_config, device_mesh)
        # verl passes a standalone replica's rank (separate_async); a hybrid replica's is the worker's RANK
        self.replica_rank = int(kwargs.get("replica_rank", os.environ.get("RANK", 0)))
        self.is_leader_rank = True
        self.sleep_level = 0

    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"rollout {BACKEND_NAME!r} takes full weights, not {wire_format!r}: "
                             "keep actor_rollout_ref.rollout.checkpoint_engine.backend at its default")
        if kwargs.get("peft_config") is not None:
            raise ValueError(f"rollout {BACKEND_NAME!r} takes merged weights: set actor_rollout_ref.model.lora.merge=True")
        # a checkpoint engine's receive_weights is an async generator; the naive engine's, a plain one
        state = {name: tensor.detach().to("cpu", copy=True) async for name, tensor in ensure_async_iterator(weights)}
        server = ray.get_actor(server_name(self.replica_rank))
        await server.load_weights.remote(state, kwargs.get("global_steps"))

    async def resume(self, tags: list[str]) -> None: ...
    async def release(self) -> None: ...
