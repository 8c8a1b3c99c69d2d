"""The drift probe (``online/drift.py``) refuses an empty probe set before asking any server."""

from __future__ import annotations

import pytest

from verl_vllm_rm.online.drift import DriftProbe


def test_a_probe_without_sequences_is_refused_before_any_request():
    asked = []
    with pytest.raises(ValueError, match=r"a drift probe needs at least one sequence to score: pass some token ids"):
        DriftProbe(lambda: asked.append("server") or None, [])
    assert asked == []
