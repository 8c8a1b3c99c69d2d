"""verl's critic engine holding the RM (``online/engine.py``) in-process: the token classifier's head bias the RM's
checkpoint lacks is removed, and any other weight that did not load is kept for the error (the engine loading and
training the RM: tests/integration/online/test_engine_trainer.py)."""

from __future__ import annotations

import torch

from verl_vllm_rm.online.engine import drop_missing_biases


def test_only_linear_biases_the_checkpoint_lacks_are_removed_and_the_rest_is_left_to_report():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))  # "1" stands for the head (score)
    left = drop_missing_biases(model, ["1.bias", "0.weight", "norm.bias"])
    assert left == ["0.weight", "norm.bias"]  # not Linear biases of the model: the caller's error names them
    assert model[1].bias is None and model[0].bias is not None
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias", "1.weight"]
    x = torch.randn(3, 2)
    assert torch.equal(model(x), model[0](x) @ model[1].weight.T)  # the head is a plain projection now


def test_nothing_missing_removes_nothing():
    model = torch.nn.Linear(3, 1)
    assert drop_missing_biases(model, []) == [] and model.bias is not None
