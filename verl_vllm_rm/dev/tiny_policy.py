"""A tiny causal-LM policy built offline on any reward model's tokenizer.

Sharing the RM's tokenizer means the policy's token ids are the RM's, so
``input_format=token_ids`` (the plugin's default) works with the RM given. The
policy is pre-trained for a few seconds on the tiny task's answers, all four
styles mixed (:mod:`verl_vllm_rm.dev.tiny_task`), so it starts out producing
every style and GRPO has something to choose between.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

from verl_vllm_rm.dev.tiny_rm import QwenShape, cached_model_dir, decoder_config
from verl_vllm_rm.dev.tiny_task import MAX_OPERAND, all_answers, question

#: For RM tokenizers without a chat template: the turns' contents one after another.
PLAIN_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@dataclass(frozen=True)
class SFTWarmUp:
    """The policy's supervised warm-up on the task's answer form, before any PPO step."""

    steps: int = 150
    batch: int = 32
    lr: float = 3e-3


@dataclass(frozen=True)
class TinyPolicySpec(QwenShape):
    """The tiny policy: its layers (smaller than the RM's), context and SFT warm-up."""

    hidden_size: int = 64
    intermediate_size: int = 128
    max_position_embeddings: int = 512
    sft: SFTWarmUp = SFTWarmUp()
    seed: int = 0


def policy_tokenizer(rm_dir: str | Path):
    """The RM's tokenizer, with a plain chat template when it has none (verl's dataset applies one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    if not tokenizer.chat_template:
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer in {rm_dir} has no EOS token; the policy needs one to stop generating: "
                         "set eos_token in its tokenizer_config.json, or give an RM whose tokenizer has one")
    return tokenizer


def policy_model_type(tokenizer) -> str:
    """``qwen2`` for a ChatML tokenizer, else ``llama``: verl's agent loop chooses how it joins chat turns by the
    policy's ``model_type``, and its Qwen handling needs ``<|im_end|>`` and a one-token newline
    (``verl/utils/tokenizer/continuous_token.py``); any other model type gets its generic handling."""
    chatml = "<|im_end|>" in tokenizer.get_vocab() and len(tokenizer.encode("\n", add_special_tokens=False)) == 1
    return "qwen2" if chatml else "llama"


def sft_examples(tokenizer, n: int, rng: random.Random) -> list[tuple[list[int], int]]:
    """``(token ids, prompt length)``: a chat prompt, then one answer of a random style, then EOS."""
    examples = []
    for _ in range(n):
        a, b = rng.randint(0, MAX_OPERAND), rng.randint(0, MAX_OPERAND)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question(a, b)}],
                                               add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        answer_ids = tokenizer(rng.choice(all_answers(a, b, rng)), add_special_tokens=False).input_ids
        examples.append((prompt_ids + answer_ids + [tokenizer.eos_token_id], len(prompt_ids)))
    return examples


def build_tiny_policy(rm_dir: str | Path, out_dir: str | Path, spec: TinyPolicySpec = TinyPolicySpec()) -> Path:
    """Create (or reuse) the tiny policy for the RM in ``rm_dir`` under ``out_dir``; returns ``out_dir``."""

    def build():
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        tokenizer = policy_tokenizer(rm_dir)
        config = decoder_config(spec, tokenizer, policy_model_type(tokenizer), tie_word_embeddings=False)
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config)
        _pretrain(model, tokenizer, spec)
        model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                                   pad_token_id=tokenizer.pad_token_id)
        return model, tokenizer

    key = {**asdict(spec), "rm": str(Path(rm_dir).resolve())}
    return cached_model_dir(out_dir, "tiny_policy_spec.json", key, build)


def _pretrain(model, tokenizer, spec: TinyPolicySpec) -> float:
    """Next-token loss on the answers only; returns the last batch's loss."""
    import torch

    rng = random.Random(spec.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.sft.lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(spec.sft.steps):
        batch = sft_examples(tokenizer, spec.sft.batch, rng)
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, prompt_len) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, prompt_len: len(ids)] = torch.tensor(ids[prompt_len:])
            mask[row, : len(ids)] = 1
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())
