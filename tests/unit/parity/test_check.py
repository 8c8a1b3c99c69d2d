"""``verl-vllm-rm check`` against the real server, and the embedding-health rules: the in-process tests (no server; those on the real server: tests/integration/parity/test_check.py)."""

from __future__ import annotations

import pytest
import torch
from verl_vllm_rm.parity.embeddings import check_matrix
from verl_vllm_rm.parity.report import compare


def test_compare_reports_the_multiplicative_error():
    assert compare([0.0, 1.0], [0.0, 1.0]) == (0.0, 0.0, 1.0)
    max_d, mean_d, mult = compare([0.0, 0.0], [0.1, -0.3])
    assert (round(max_d, 6), round(mean_d, 6)) == (0.3, 0.2)
    assert abs(mult - (torch.exp(torch.tensor(0.1)) + torch.exp(torch.tensor(0.3))).item() / 2) < 1e-6


@pytest.mark.parametrize("reference, served, got", [([0.0, 1.0], [0.0], "2 and 1"), ([], [], "0 and 0")])
def test_compare_refuses_lists_it_cannot_pair(reference, served, got):
    with pytest.raises(ValueError, match=r"parity compares score lists item by item: need two non-empty lists of "
                                         rf"equal length \(one reference score per probe\), got {got}"):
        compare(reference, served)


def test_embedding_health_flags_zero_and_identical_rows():
    torch.manual_seed(0)
    w = torch.randn(10, 8)
    assert check_matrix("e", w).ok
    w[3] = 0.0
    w[7] = w[5]
    report = check_matrix("e", w)
    assert report.near_zero_rows == [3] and report.identical_row_groups == [[5, 7]] and not report.ok
    assert check_matrix("e", w, ignore_rows=(3, 7)).ok
    w[8] = w[2] + 1e-4
    assert [2, 8] in check_matrix("e", w, identical_tol=1e-3, ignore_rows=(3, 7)).identical_row_groups


def test_the_reference_reads_one_value_per_head_and_refuses_a_head_of_attributes():
    """A scalar head's value, a two-class head's margin good - bad at the last token; more outputs have no single
    reward to compare (``verl-vllm-rm check`` on an attribute RM)."""
    from verl_vllm_rm.parity.reference import last_token_reward

    assert last_token_reward(torch.tensor([[[0.5], [2.0]]])) == 2.0  # token classifier [1, tokens, 1]
    assert last_token_reward(torch.tensor([[1.0, 3.5]])) == 2.5  # sequence classifier [1, (bad, good)]
    with pytest.raises(ValueError) as refused:
        last_token_reward(torch.tensor([[0.1, 0.2, 0.3]]))
    assert str(refused.value) == ("a head of 3 outputs has no single reward to compare: parity reads a scalar or a "
                                  "two-class ([bad, good]) head")
