"""The mixed-precision promise of a bf16 server's inventory, checked on the inventories seen: the head float32,
every backbone matrix bf16, a bias maybe wider (vLLM-CPU's small-GEMM path on AMX CPUs); the bf16 servers
themselves: tests/integration/online/test_bf16_parity.py."""

from __future__ import annotations

import pytest
from sync_helpers import mixed_precision_breaches

HEAD_PATTERNS = ("score.*",)


def tiny_rm_inventory(wider_biases: bool) -> dict[str, dict]:
    """The tiny RM's bf16 inventory as the issue's Xeon (avx512_bf16 and amx_bf16) reported it
    (``wider_biases``: the q/k/v biases in float32) or as a CPU without AMX reports it (all bf16 but the head)."""
    def entry(name: str, shape: list[int], dtype: str = "bfloat16") -> tuple[str, dict]:
        return name, {"name": name, "dtype": dtype, "shape": shape}

    params = dict([entry("model.embed_tokens.weight", [1000, 128]), entry("model.norm.weight", [128]),
                   entry("score.weight", [1, 128], "float32")])
    for layer in range(2):
        prefix = f"model.layers.{layer}"
        bias = "float32" if wider_biases else "bfloat16"
        params.update([entry(f"{prefix}.self_attn.{p}_proj.weight", [128, 128]) for p in "qkvo"])
        params.update([entry(f"{prefix}.self_attn.{p}_proj.bias", [128], bias) for p in "qkv"])
        params.update([entry(f"{prefix}.mlp.{p}_proj.weight", shape) for p, shape in
                       (("gate", [256, 128]), ("up", [256, 128]), ("down", [128, 256]))])
        params.update([entry(f"{prefix}.{norm}.weight", [128]) for norm in
                       ("input_layernorm", "post_attention_layernorm")])
    return params


@pytest.mark.parametrize("wider_biases", [True, False])
def test_the_inventories_seen_keep_the_mixed_precision_promise(wider_biases):
    assert mixed_precision_breaches(tiny_rm_inventory(wider_biases), HEAD_PATTERNS, "bfloat16") == []


@pytest.mark.parametrize(("name", "dtype", "breach"), [
    ("model.layers.0.self_attn.q_proj.weight", "float32",
     "backbone model.layers.0.self_attn.q_proj.weight (2-D) is float32, not bfloat16"),
    ("model.norm.weight", "float32", "backbone model.norm.weight (1-D) is float32, not bfloat16"),
    ("score.weight", "bfloat16", "head score.weight is bfloat16, not float32"),
])
def test_a_wider_matrix_a_wider_norm_or_a_narrow_head_breaks_the_promise(name, dtype, breach):
    params = tiny_rm_inventory(wider_biases=True)
    params[name] = {**params[name], "dtype": dtype}
    assert mixed_precision_breaches(params, HEAD_PATTERNS, "bfloat16") == [breach]
