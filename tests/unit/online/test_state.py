"""How much of the RM one rank holds (``online/state.py``): bytes of parameters, gradients and optimizer state
(sharded tensors on 1 and 2 ranks: tests/integration/online/test_engine_trainer.py)."""

from __future__ import annotations

import torch

from verl_vllm_rm.online.state import local_bytes, sharded_state_bytes


def test_bytes_are_elements_times_their_size_summed_over_the_tensors():
    assert local_bytes([torch.zeros(3, 4), torch.zeros(5, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.int64)]) \
        == 3 * 4 * 4 + 5 * 2 + 2 * 8
    assert local_bytes([]) == 0


def test_a_model_before_and_after_an_adam_step_counts_its_gradients_and_both_moments_not_the_step_count():
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 3)  # 33 fp32 parameters: 132 bytes
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    assert sharded_state_bytes(model, optimizer) == {"params": 132, "grads": 0, "optimizer": 0, "total": 132}
    model(torch.randn(4, 10)).sum().backward()
    optimizer.step()  # exp_avg and exp_avg_sq per parameter; each parameter's `step` is a 0-d tensor
    assert sharded_state_bytes(model, optimizer) == {"params": 132, "grads": 132, "optimizer": 264, "total": 528}
    assert sharded_state_bytes(model, None) == {"params": 132, "grads": 132, "optimizer": 0, "total": 264}


def test_a_frozen_parameter_counts_its_weights_but_has_no_gradient():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))  # 20 + 5 parameters
    model[0].requires_grad_(False)
    model(torch.randn(2, 4)).sum().backward()
    assert sharded_state_bytes(model, None) == {"params": 100, "grads": 20, "optimizer": 0, "total": 120}
