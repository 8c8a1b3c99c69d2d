"""The parity probe a publisher runs after every N publishes (real server, real gloo transport): the in-process tests (no server; those on the real server: tests/integration/parity/test_probe.py)."""

from __future__ import annotations
import pytest
from verl_vllm_rm.weight_sync import ParityProbe


@pytest.mark.parametrize("kwargs, needle", [
    ({"every": 0}, "parity probe every must be >= 1"),
    ({"threshold": 0.9}, "parity probe threshold bounds mean(exp|diff|), which is 1 for equal scores and above 1 "
                         "otherwise: set it >= 1 (1.05 by default), got 0.9"),
    ({"max_probes": 0}, "parity probe max_probes must be >= 1"),
])
def test_bad_probe_options(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("|", r"\|")):
        ParityProbe(**kwargs)


def test_the_bound_follows_the_coarser_compute_dtype():
    from verl_vllm_rm.parity.probe import LOW_PRECISION_FACTOR, coarsest, max_abs_bound

    assert coarsest("float32", "bfloat16") == coarsest("bfloat16", "float16") == "bfloat16"
    assert max_abs_bound("float32", [50.0]) == 1e-4  # fp32: absolute, never scaled
    assert max_abs_bound("bfloat16", [-3.0, 1.0]) == pytest.approx(LOW_PRECISION_FACTOR * 2**-8 * 4.0)
    assert max_abs_bound("float16", [1.0]) == pytest.approx(LOW_PRECISION_FACTOR * 2**-11 * 2.0)
    with pytest.raises(ValueError, match=r"no parity bound for dtype\(s\) \['int8'\]"):
        coarsest("float32", "int8")
    with pytest.raises(ValueError, match="no parity bound"):
        ParityProbe(compute_dtype="fp32")
