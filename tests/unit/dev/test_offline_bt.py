"""The dev tools' single-process BT trainer (``dev/offline_bt.py``): inputs it cannot train on are refused."""

from __future__ import annotations

import pytest
import torch

from verl_vllm_rm.dev.offline_bt import OfflineBradleyTerry, collate_pairs
from verl_vllm_rm.online.trainable import prepare_reward_model


@pytest.mark.parametrize("chosen, rejected, got", [([[1, 2]], [], "1 and 0"), ([], [], "0 and 0")])
def test_unmatched_or_no_pairs_are_refused(chosen, rejected, got):
    with pytest.raises(ValueError, match=rf"need as many chosen as rejected sequences \(>0\), got {got}"):
        collate_pairs(chosen, rejected, pad_id=0)


def test_a_frozen_model_is_refused_until_prepare_reward_model_chooses_what_trains(tiny_rm, preference_batch):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm, dtype=torch.float32).requires_grad_(False)
    with pytest.raises(ValueError, match=r"the reward model has no trainable parameter \(all have "
                                         r"requires_grad=False\): call prepare_reward_model\(model, training_mode\)"):
        OfflineBradleyTerry(model)
    trainer = OfflineBradleyTerry(prepare_reward_model(model, "head_only"))  # the fix the message names
    assert trainer.step(preference_batch)["rm/bt_loss"] > 0
