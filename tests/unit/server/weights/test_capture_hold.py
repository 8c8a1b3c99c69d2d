"""The tests' hold on the LoRA base store's copy (``server.weights.capture_hold``), in process: unless a test named
an existing file, the copy goes on at once and leaves no mark (the hold itself, seen from a running server's
scoring: tests/integration/weight_sync/test_lora_adapters.py)."""

from __future__ import annotations

from verl_vllm_rm.server.weights.capture_hold import CAPTURE_HOLD_ENV, hold_while_asked


def test_with_no_hold_asked_the_copy_goes_on_at_once(monkeypatch, tmp_path):
    monkeypatch.delenv(CAPTURE_HOLD_ENV, raising=False)
    assert hold_while_asked() is None


def test_a_hold_file_that_does_not_exist_holds_nothing_and_marks_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(CAPTURE_HOLD_ENV, str(tmp_path / "hold"))
    assert hold_while_asked() is None
    assert list(tmp_path.iterdir()) == []  # no "<file>.held": the test knows the copy was not held
