"""The check that saved whitening moments equal the scores' own."""

from __future__ import annotations

import numpy as np
import pytest


def assert_moments(moments, scores: np.ndarray) -> None:
    assert moments.count == len(scores)
    assert moments.mean == pytest.approx(scores.mean(), abs=1e-9)
    assert moments.m2 == pytest.approx(((scores - scores.mean()) ** 2).sum(), rel=1e-9, abs=1e-9)
