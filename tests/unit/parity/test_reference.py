"""Reference scores of the reward model in transformers (``parity/reference.py``): the value a head gives at the
last token, and the per-step values at the step tags (against the served model: tests/integration/parity/)."""

from __future__ import annotations

import re
import pytest
import torch

from verl_vllm_rm.parity.corpus import STEP
from verl_vllm_rm.parity.reference import last_token_reward, load_reward_model, sequence_scores, step_scores


def test_the_reference_reads_one_value_per_head_and_refuses_a_head_of_attributes():
    """A scalar head's value, a two-class head's margin good - bad at the last token; more outputs have no single
    reward to compare (``verl-vllm-rm check`` on an attribute RM)."""
    assert last_token_reward(torch.tensor([[[0.5], [2.0]]])) == 2.0  # token classifier [1, tokens, 1]
    assert last_token_reward(torch.tensor([[1.0, 3.5]])) == 2.5  # sequence classifier [1, (bad, good)]
    refusal = ("a head of 3 outputs has no single reward to compare: parity reads a scalar or a two-class "
               "([bad, good]) head")
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        last_token_reward(torch.tensor([[0.1, 0.2, 0.3]]))


def test_a_step_tag_at_the_end_scores_what_the_sequence_scores(hf_model, tokenizer):
    """The sequence classifier's pooled value and the head applied by hand to the last hidden state agree where
    the last token is a step tag; a text with two tags has two step values."""
    step_id = tokenizer.convert_tokens_to_ids(STEP)
    one = tokenizer(f"What is 2 + 3? The answer is 5. {STEP}").input_ids
    two = tokenizer(f"What is 2 + 3? {STEP} The answer is 5. {STEP}").input_ids
    assert one[-1] == step_id and two.count(step_id) == 2
    (whole,) = sequence_scores(hf_model, [one])
    steps = step_scores(hf_model, [one, two], step_id)
    assert [len(s) for s in steps] == [1, 2]
    assert steps[0][0] == pytest.approx(whole, abs=1e-5)
    assert sequence_scores(hf_model, [two])[0] == pytest.approx(steps[1][1], abs=1e-5)


def test_the_model_is_loaded_once_per_path_in_fp32_eval_mode(tiny_rm):
    model = load_reward_model(tiny_rm)
    assert load_reward_model(tiny_rm) is model
    assert not model.training and next(model.parameters()).dtype == torch.float32
