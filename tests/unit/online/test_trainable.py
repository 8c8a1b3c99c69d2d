"""What trains in each mode (``online/trainable.py``): the head, LoRA adapters plus the head, or everything; a
two-class head read as its margin; and the heads online training refuses, saying why (the refusal at the trainer
mode's start-up: tests/unit/plugin/test_online_mode.py)."""

from __future__ import annotations

import pytest
import torch

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.online.trainable import (
    MarginHead, check_trainable_head, freeze_all_but_head, head_module_names, head_outputs, is_two_class_head,
    prepare_reward_model, read_two_class_margin, untrainable_head_reason,
)


class TinyClassifier(torch.nn.Module):
    """A backbone and a head named ``score``, as a ``*ForSequenceClassification`` names it."""

    def __init__(self, outputs: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(4, 4)
        self.score = torch.nn.Linear(4, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.score(self.body(x))


def trainable(model: torch.nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def test_each_mode_makes_exactly_its_part_trainable():
    assert head_module_names(TinyClassifier()) == ["score"]
    assert trainable(prepare_reward_model(TinyClassifier(), "head_only")) == ["score.weight", "score.bias"]
    frozen = TinyClassifier().requires_grad_(False)
    assert trainable(prepare_reward_model(frozen, "full")) == ["body.weight", "body.bias", "score.weight", "score.bias"]
    lora = prepare_reward_model(TinyClassifier(), "lora", lora_rank=2, lora_alpha=4)
    assert trainable(lora) == ["base_model.model.body.lora_A.default.weight",
                               "base_model.model.body.lora_B.default.weight",
                               "base_model.model.score.modules_to_save.default.weight",  # the head in full, no LoRA
                               "base_model.model.score.modules_to_save.default.bias"]


def test_head_only_training_without_a_head_and_an_unknown_mode_are_refused():
    with pytest.raises(ValueError, match=r"head_only training found no head parameter matching \['score\.\*', "
                                         r"'classifier\.\*'\] in Sequential: use training_mode=lora or full, or a "
                                         r"classifier whose head is named score\.\* or classifier\.\*"):
        freeze_all_but_head(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(ValueError, match=r"unknown training_mode 'adapters'"):
        prepare_reward_model(TinyClassifier(), "adapters")


def test_a_two_class_head_gives_its_margin_good_minus_bad_with_its_weights_untouched():
    model = TinyClassifier(outputs=2)
    x = torch.randn(3, 4)
    logits = model(x)
    weight = model.score.weight.detach().clone()
    read_two_class_margin(model)
    assert type(model.score) is MarginHead and torch.equal(model.score.weight, weight)
    assert torch.allclose(model(x), logits[:, 1:] - logits[:, :1])
    assert model(x).shape == (3, 1)


def test_a_head_that_is_not_one_linear_of_two_outputs_has_no_margin():
    with pytest.raises(ValueError, match=r"a two-class RM's head is one Linear of 2 outputs; TinyClassifier has "
                                         r"\['Linear'\] matching \['score\.\*', 'classifier\.\*'\]: train a scalar or "
                                         r"two-class \*ForSequenceClassification"):
        read_two_class_margin(TinyClassifier(outputs=3))


@pytest.mark.parametrize("config, outputs, two_class", [
    ({}, 1, False),
    ({"num_labels": 2}, 2, True),
    ({"id2label": {"0": "bad", "1": "good"}}, 2, True),  # id2label wins over a num_labels left at its default
    ({"id2label": {"0": "a", "1": "b"}, "problem_type": "regression"}, 2, False),  # two attributes
    ({"num_labels": 3}, 3, False),
])
def test_a_configs_head_outputs_and_whether_it_is_two_class(config, outputs, two_class):
    assert head_outputs(config) == outputs and is_two_class_head(config) is two_class


def test_a_scalar_or_two_class_classifier_trains_and_a_path_without_config_is_left_to_verl(tmp_path):
    assert untrainable_head_reason({"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 2}) is None
    assert untrainable_head_reason({}).startswith("an unnamed architecture is not a sequence classifier")
    check_trainable_head(str(tmp_path / "not-there"))  # no config.json: verl's loader names the problem


def test_check_trainable_head_refuses_an_untrainable_checkpoint_naming_the_path(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["MistralForCausalLM"]}')
    with pytest.raises(ConfigError, match=rf"^online_rm\.model_path={tmp_path}: MistralForCausalLM is not a sequence "
                                          r"classifier .*; online_rm trains a reward model with a scalar or two-class "
                                          r"head .*or train a scalar RM$"):
        check_trainable_head(str(tmp_path))


def test_the_tiny_rm_and_the_family_builders_configs_read_as_they_are(tiny_rm, tmp_path):
    """The refusal reads config.json as transformers writes it: the tiny RM (num_labels=1, id2label LABEL_0) and
    the two-class family train; the attribute family is refused as attributes."""
    import json

    from verl_vllm_rm.dev.tiny_rm_families import build_tiny_attribute_rm, build_tiny_two_class_rm

    check_trainable_head(tiny_rm)  # no refusal
    check_trainable_head(str(build_tiny_two_class_rm(tmp_path / "two_class")))
    attributes = json.loads((build_tiny_attribute_rm(tmp_path / "attributes") / "config.json").read_text())
    assert untrainable_head_reason(attributes).startswith("Qwen2ForSequenceClassification has 5 attribute outputs")
