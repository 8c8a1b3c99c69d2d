"""The tests' reload fault (``server.weights.reload_fault``), in process: with no switch a reload's weights pass
untouched; a switch file's lines fault the coming reloads in turn, the first process to reload claims it, and the
claimed file is gone once every fault happened."""

from __future__ import annotations

import os

import torch

from verl_vllm_rm.server.weights.reload_fault import RELOAD_FAULT_ENV, with_test_fault

WEIGHTS = [(f"w{i}", torch.full((2,), float(i))) for i in range(4)]


def loaded(weights) -> list[str]:
    """The names a loader took from ``weights`` before it ended (or raised)."""
    names = []
    try:
        for name, _ in weights:
            names.append(name)
    except RuntimeError as e:
        names.append(f"raised: {e}")
    return names


def test_without_a_switch_the_weights_pass_untouched(monkeypatch, tmp_path):
    monkeypatch.delenv(RELOAD_FAULT_ENV, raising=False)
    assert with_test_fault(WEIGHTS) is WEIGHTS
    monkeypatch.setenv(RELOAD_FAULT_ENV, str(tmp_path / "absent"))  # a switch no test wrote: no fault
    assert with_test_fault(WEIGHTS) is WEIGHTS


def test_each_line_faults_one_reload_after_that_many_tensors_then_the_switch_is_gone(monkeypatch, tmp_path):
    switch = tmp_path / "faults"
    switch.write_text("2\n0\n")
    monkeypatch.setenv(RELOAD_FAULT_ENV, str(switch))
    claimed = tmp_path / f"faults.claimed-{os.getpid()}"
    assert loaded(with_test_fault(WEIGHTS)) == ["w0", "w1", "raised: injected reload fault after 2 tensors"]
    assert not switch.exists() and claimed.read_text() == "0"  # claimed by this process, one fault left
    assert loaded(with_test_fault(WEIGHTS)) == ["raised: injected reload fault after 0 tensors"]
    assert not claimed.exists()
    assert with_test_fault(WEIGHTS) is WEIGHTS  # every fault happened: reloads run untouched again


def test_a_fault_is_taken_when_the_reload_starts_not_when_its_weights_are_read(monkeypatch, tmp_path):
    switch = tmp_path / "faults"
    switch.write_text("1")
    monkeypatch.setenv(RELOAD_FAULT_ENV, str(switch))
    faulty = with_test_fault(iter(WEIGHTS))
    assert list(tmp_path.iterdir()) == []  # the last fault taken: switch and claim gone before a tensor is read
    assert loaded(faulty) == ["w0", "raised: injected reload fault after 1 tensors"]
