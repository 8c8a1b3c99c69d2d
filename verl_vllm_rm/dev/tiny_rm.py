"""Build a tiny, fully offline reward model: a BPE tokenizer trained on the fly and
a Qwen2 ``ForSequenceClassification`` model with a scalar head.

It exists so tests, the demo and the benchmarks run a *real* vLLM engine on CPU
without downloading anything. vLLM-CPU's attention takes a head_dim of 32, 64, 80, 96,
112, 128, ... only, hence 4 heads over a hidden size of 128 (head_dim 32).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

from verl_vllm_rm.parity.corpus import STEP, synthetic_corpus

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END, STEP]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
@dataclass(frozen=True)
class QwenShape:
    """The layers of a tiny decoder (:func:`decoder_config`: Qwen2, Llama or Mistral); the defaults start on
    vLLM-CPU."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2


@dataclass(frozen=True)
class TinyRMSpec(QwenShape):
    """The tiny reward model: its layers, context, tokenizer and head."""

    max_position_embeddings: int = 2048
    vocab_size: int = 1000
    head_std: float = 0.1
    seed: int = 0  # the tokenizer's corpus, and the weights unless init_seed is set
    init_seed: int | None = None  # other weights on the same tokenizer (an ensemble's second RM)


# The ~100M-parameter RM of the benchmarks and of the weight-sync memory test (101.5M with its head; fp32: 406 MB)
RM_100M = TinyRMSpec(hidden_size=768, intermediate_size=2048, num_hidden_layers=16, num_attention_heads=12,
                     num_key_value_heads=4)


def build_tokenizer(spec: TinyRMSpec):
    """Train a byte-level BPE tokenizer and wrap it for ``save_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(seed=spec.seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=[IM_START, IM_END, STEP],
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )


def decoder_config(spec: QwenShape, tokenizer, model_type: str = "qwen2", **extra):
    """A float32 config of ``model_type`` (``qwen2``, ``llama`` or ``mistral``) with ``spec``'s layers and
    ``max_position_embeddings`` on ``tokenizer``."""
    from transformers import AutoConfig

    shape = {f.name: getattr(spec, f.name) for f in fields(QwenShape)}
    return AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **shape,
                                max_position_embeddings=spec.max_position_embeddings,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                bos_token_id=tokenizer.bos_token_id, torch_dtype="float32", **extra)


def cached_model_dir(out_dir: str | Path, stamp_name: str, key: dict, build: Callable[[], tuple[Any, Any]]) -> Path:
    """``out_dir`` as it is when its stamp file says it was built from ``key``; otherwise ``build()``'s
    (model, tokenizer) saved there (safetensors) with the stamp. Returns the directory."""
    out = Path(out_dir)
    stamp = out / stamp_name
    if stamp.exists() and json.loads(stamp.read_text()) == key:
        return out
    model, tokenizer = build()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    stamp.write_text(json.dumps(key))
    return out


def build_tiny_rm(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec()) -> Path:
    """Create (or reuse) the tiny reward model under ``out_dir`` and return its path.

    The directory is reused when it already holds a model built from the same spec.
    """

    def build():
        import torch
        from transformers import Qwen2ForSequenceClassification

        tokenizer = build_tokenizer(spec)
        config = decoder_config(spec, tokenizer, num_labels=1, tie_word_embeddings=False)
        torch.manual_seed(spec.seed if spec.init_seed is None else spec.init_seed)
        model = Qwen2ForSequenceClassification(config)
        with torch.no_grad():
            model.score.weight.normal_(0.0, spec.head_std)
        return model, tokenizer

    return cached_model_dir(out_dir, "tiny_rm_spec.json", asdict(spec), build)
