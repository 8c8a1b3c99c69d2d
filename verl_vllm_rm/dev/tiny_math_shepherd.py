"""A tiny, offline Math-Shepherd-kind process reward model: a ``MistralForCausalLM`` on a SentencePiece-style
tokenizer, as ``peiyi9979/math-shepherd-mistral-7b-prm`` is.

The card reads the logits of the good and bad tokens at each step tag: ``tokenizer.encode("+ -")[1:]`` (the pieces
``▁+`` and ``▁-``, 648 and 387 in the published tokenizer) at ``tokenizer.encode("ки")[-1]`` (``▁ки``). What makes
that recipe worth a tiny model: a Metaspace tokenizer marks a word's leading space in the piece itself, and its
vocabulary also holds the bare ``+`` and ``-`` as other tokens, so looking the strings up in the vocabulary reads
other rows of the LM head than the card does. The tokenizer is a BPE over Metaspace pieces with the published
specials (``<unk>``, ``<s>``, ``</s>``) and ``<s>`` prepended by ``encode``, trained on arithmetic whose steps end
in `` ки``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

from verl_vllm_rm.dev.tiny_rm import QwenShape, cached_model_dir, decoder_config

STEP_TAG = "ки"
GOOD, BAD = "+", "-"


@dataclass(frozen=True)
class TinyMathShepherdSpec(QwenShape):
    """The model's layers (the tiny RM's), context and Metaspace BPE vocabulary."""

    vocab_size: int = 800
    max_position_embeddings: int = 512
    seed: int = 0


def shepherd_corpus(n_lines: int = 2000, seed: int = 0) -> list[str]:
    """Questions with one step per line, each step ending in `` ки`` (the card's format), deterministic."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op, value = rng.choice([("+", a + b), ("-", a - b)])
        lines.append(f"What is {a} {op} {b}? Step 1: {a} {op} {b} = {value} {STEP_TAG}\n"
                     f"Step 2: The answer is {value} {STEP_TAG}")
    return lines


def build_tokenizer(spec: TinyMathShepherdSpec):
    """A Metaspace BPE (``▁`` marks a leading space, prepended to the first word; a line break apart) with ``<s>``
    added by encode."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([  # a line break is a token of its own, as Mistral's <0x0A>
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(shepherd_corpus(seed=spec.seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                        model_max_length=spec.max_position_embeddings)
    vocab = tokenizer.get_vocab()
    pieces = ("▁" + GOOD, "▁" + BAD, GOOD, BAD, "▁" + STEP_TAG)
    if not all(p in vocab for p in pieces):
        # internal: the corpus above is fixed; a tokenizers release that merged differently would show here
        raise RuntimeError(f"the tiny Math-Shepherd vocabulary lacks one of {pieces}")
    return tokenizer


def build_tiny_math_shepherd(out_dir: str | Path, spec: TinyMathShepherdSpec = TinyMathShepherdSpec()) -> Path:
    """Create (or reuse) the tiny Math-Shepherd-kind model under ``out_dir`` and return its path."""

    def build():
        import torch
        from transformers import MistralForCausalLM

        tokenizer = build_tokenizer(spec)
        config = decoder_config(spec, tokenizer, model_type="mistral", tie_word_embeddings=False, sliding_window=None)
        torch.manual_seed(spec.seed)
        return MistralForCausalLM(config), tokenizer

    return cached_model_dir(out_dir, "tiny_math_shepherd.json", asdict(spec), build)
