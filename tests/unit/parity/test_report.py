"""Refit parity's measures (``parity/report.py``): the differences of two score lists and when a report passes
(the parity run against the real server: tests/integration/parity/test_check.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from verl_vllm_rm.parity.report import ParityReport, compare


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


PASSING = ParityReport(probes=4, max_abs_diff=0.01, mean_abs_diff=0.005, mult_error=1.01, batch_invariance_max_diff=0.0,
                       repeat_max_diff=0.0, threshold=1.05, invariance_tolerance=1e-4)


@pytest.mark.parametrize("change", [
    {"mult_error": 1.06},  # over the multiplicative threshold
    {"max_abs_bound": 0.005},  # over the compute precision's bound on max |diff|
    {"batch_invariance_max_diff": 2e-4},  # batches of another size score otherwise
    {"repeat_max_diff": 2e-4},  # the same batch twice scores otherwise
])
def test_a_report_fails_when_any_one_measure_is_over_its_limit(change):
    assert PASSING.ok
    assert not replace(PASSING, **change).ok


def test_a_report_passes_on_its_limits_and_says_so_in_its_dict():
    edge = replace(PASSING, mult_error=1.05, max_abs_bound=0.01, batch_invariance_max_diff=1e-4, repeat_max_diff=1e-4)
    assert edge.ok
    assert edge.as_dict() == {"probes": 4, "max_abs_diff": 0.01, "mean_abs_diff": 0.005, "mult_error": 1.05,
                              "batch_invariance_max_diff": 1e-4, "repeat_max_diff": 1e-4, "threshold": 1.05,
                              "invariance_tolerance": 1e-4, "max_abs_bound": 0.01, "ok": True}
    assert replace(PASSING, mult_error=1.2).as_dict()["ok"] is False
