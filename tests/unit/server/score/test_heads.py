"""Which engine requests each served head needs, and how their tensors become the reward (pure torch): a logit
(a two-label head's margin), or with ``normalize`` its sigmoid."""

import pytest
import torch

from verl_vllm_rm.protocol.model_shape import model_shape
from verl_vllm_rm.server.score.heads import engine_tasks, read_head

DTYPES = dict(backbone_dtype="float32", head_dtype="float32")
SEQ_CLS = {"classify", "token_classify"}


def seq_cls(num_labels=1, **kw):
    return model_shape("Qwen2ForSequenceClassification", SEQ_CLS, num_labels=num_labels, **DTYPES, **kw)


def test_a_scalar_sequence_classifier_is_its_last_token_value_and_its_rows_at_step_tags():
    shape = seq_cls(step_tag_id=3)
    assert engine_tasks(shape) == ("classify", "token_classify")
    got = read_head(shape, [torch.tensor([0.25]), torch.tensor([[0.5], [-1.0]])], normalize=False)
    assert (got.score, got.step_scores, got.attributes) == (0.25, [0.5, -1.0], None)
    got = read_head(shape, [torch.tensor([0.25]), torch.tensor([[0.5], [-1.0]])], normalize=True)
    assert (got.score, got.step_scores) == (pytest.approx(torch.sigmoid(torch.tensor(0.25)).item()),
                                            pytest.approx(torch.sigmoid(torch.tensor([0.5, -1.0])).tolist()))
    assert read_head(shape, [torch.tensor([0.25]), torch.zeros(0)], False).step_scores == []  # no step: no number
    assert read_head(seq_cls(), [torch.tensor([0.25])], False).step_scores is None


def test_a_native_reward_model_is_the_last_row_of_its_per_token_values():
    shape = model_shape("Qwen2ForRewardModel", {"token_classify"}, num_labels=1, **DTYPES)
    assert engine_tasks(shape) == ("token_classify",)
    assert read_head(shape, [torch.tensor([[0.1], [0.2], [0.7]])], False).score == pytest.approx(0.7)
    assert read_head(shape, [torch.tensor([[0.1], [0.7]])], True).score == pytest.approx(
        torch.sigmoid(torch.tensor(0.7)).item())


@pytest.mark.parametrize("normalize", [False, True])
def test_attributes_are_the_raw_outputs_in_label_order(normalize):
    shape = seq_cls(num_labels=3, problem_type="regression")
    assert engine_tasks(shape) == ("classify",)  # never vLLM's softmax over attributes
    got = read_head(shape, [torch.tensor([1.5, -0.5, 3.0])], normalize)
    assert (got.score, got.attributes) == (None, [1.5, -0.5, 3.0])


def test_two_class_is_the_margin_of_the_raw_logits_or_p_good():
    shape = seq_cls(num_labels=2)
    logits = torch.tensor([0.3, 1.1])  # [bad, good]
    assert engine_tasks(shape) == ("classify",)
    assert read_head(shape, [logits], False).score == pytest.approx(0.8)
    assert read_head(shape, [logits], True).score == pytest.approx(torch.softmax(logits, 0)[1].item())


def test_a_qwen_prm_step_score_is_the_positive_margin_or_p_positive():
    shape = model_shape("Qwen2ForProcessRewardModel", {"token_classify"}, num_labels=2, step_tag_id=5, **DTYPES)
    rows = torch.tensor([[0.9, 0.1], [0.2, 0.8]])  # [negative, positive] per step
    assert engine_tasks(shape) == ("token_classify",)
    assert read_head(shape, [rows], False).step_scores == pytest.approx([-0.8, 0.6])
    got = read_head(shape, [rows], True)
    assert (got.score, got.step_scores) == (None, pytest.approx(torch.softmax(rows, -1)[:, 1].tolist()))
    assert read_head(shape, [torch.zeros(0)], True).step_scores == []


def test_a_math_shepherd_step_score_is_the_good_token_margin_or_p_good():
    shape = model_shape("MistralForCausalLM", SEQ_CLS, num_labels=2, step_tag_id=5, step_tokens=(7, 8), **DTYPES)
    rows = torch.tensor([[0.6, 0.4], [0.3, 0.7]])  # [good, bad] token logits per step
    assert engine_tasks(shape) == ("token_classify",)
    assert read_head(shape, [rows], False).step_scores == pytest.approx([0.2, -0.4])
    assert read_head(shape, [rows], True).step_scores == pytest.approx(torch.softmax(rows, -1)[:, 0].tolist())
