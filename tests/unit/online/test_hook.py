"""The publish hook after each RM step (``online/hook.py``) in-process: which steps publish and its training mode
(publishing into real servers: tests/integration/online/test_hook.py)."""

from __future__ import annotations

import pytest
import torch

from verl_vllm_rm.online.hook import PublishAfterStep
from verl_vllm_rm.protocol.names import RewardModelTrainingMode


def test_a_step_off_the_schedule_publishes_nothing_and_builds_no_publisher():
    """Every 3rd step publishes: steps 1, 2, 4, 5 return no metrics and never build the publisher; step 3 does
    (here the publisher cannot be built, so the due step fails with its error)."""
    built = []

    def make_publisher():
        built.append(True)
        raise RuntimeError("no reward server to publish to")

    hook = PublishAfterStep(make_publisher, "lora", every=3)
    assert hook.mode is RewardModelTrainingMode.LORA
    model = torch.nn.Linear(2, 1)
    assert [hook(step, model) for step in (1, 2, 4, 5)] == [{}, {}, {}, {}]
    assert built == [] and hook.publisher is None
    with pytest.raises(RuntimeError, match="no reward server to publish to"):
        hook(3, model)
    assert built == [True]


def test_an_unknown_training_mode_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError,
                       match=r"unknown training_mode 'partial'; use one of \['head_only', 'lora', 'full'\]"):
        PublishAfterStep(lambda: None, "partial")
    assert PublishAfterStep(lambda: None, RewardModelTrainingMode.FULL).every == 1
