"""bf16 against the trainer: parity inside the bound derived from the measured spread (``parity.probe.max_abs_bound``;
``benchmarks/bench_bf16_parity.py``), and the mixed-precision promise of the server's inventory.

What is promised for a bf16 server: each weight is published in the dtype its ``/weight_inventory`` entry names;
the head stays float32; every backbone matrix is bf16. vLLM's kernels may keep a bias wider than the backbone:
vLLM-CPU's small-GEMM path on CPUs with AMX tiles (``dispatch_cpu_unquantized_gemm``) casts the bias of a linear of
at most 1 MiB to float32, so the tiny RM's q/k/v biases serve in float32 on such a CPU, a 7B model's do not.

vLLM-CPU 0.32 serves bfloat16 on any x86 CPU (its platform lists bf16 whatever the flags; measured on an AVX2-only
AMD EPYC Zen 3 and on an avx512_bf16 Xeon, ``benchmarks/results/bf16_parity_avx2.json`` and ``bf16_parity.json``), so
every test here runs on every CPU: the bf16 server's inventory, its parity with the trainer's bf16 forward, and the
trainer's bf16 forward against an fp32 server."""

from __future__ import annotations

import pytest
from sync_helpers import engine_rm_config, inventory_dtypes, max_diff, mixed_precision_breaches, runtime_version, \
    server_scores

from verl_vllm_rm.parity.probe import FP32_MAX_ABS_DIFF, max_abs_bound


def trained_in_bf16(url: str, tiny_rm: str, rollout, probe_ids, mode: str) -> float:
    """verl's engine with ``param_dtype=bf16`` trains 2 RM steps in ``mode`` from the on-disk RM, publishing each to
    the server at ``url``: every step's version serves, and the parity probe (it raises above the bound) and the
    direct spread stay within the bf16 bound. The last step's spread."""
    from verl_vllm_rm.online.driver import OnlineRewardModel

    rm = OnlineRewardModel(engine_rm_config(tiny_rm, url, mode, 1, param_dtype="bf16"))
    try:
        rm.resume(None)  # the on-disk RM, published: each run starts from the same weights
        uids, sequences, rewards, _ = rollout
        for step in (1, 2):
            metrics = rm.train_on_rollout(uids, sequences, rewards, step=step)
            assert metrics["rm/published_version"] == runtime_version(url)
            if mode == "lora":  # the adapters travel in the server's dtype and the server merges them
                assert metrics["rm/publish_lora_adapters"] == 1.0
            trainer = rm.worker_group.reference_scores(probe_ids)[0]
            spread = max_diff(server_scores(url, probe_ids), trainer)
            assert spread <= max_abs_bound("bfloat16", trainer)
            assert metrics["rm/parity_max_abs_diff"] <= max_abs_bound("bfloat16", trainer)
            print(f"PARITY bf16 trainer, {mode}, step {step}: {spread:.3g} (bound "
                  f"{max_abs_bound('bfloat16', trainer):.3g})")
    finally:
        rm.close()
    return spread


def test_the_trainers_bf16_forward_scores_the_fp32_servers_weights_within_the_bf16_bound(ray_cluster, ws_server,
                                                                                           tiny_rm, rollout,
                                                                                           probe_ids):
    """The bf16 trainer publishes its fp32 master weights to the fp32 server; the parity probe
    applies the bf16 bound (the trainer is the coarser side)."""
    spread = trained_in_bf16(ws_server.url, tiny_rm, rollout, probe_ids, "full")
    assert spread > FP32_MAX_ABS_DIFF  # the trainer really computes in bf16 (an fp32 forward agrees to 1e-6)


@pytest.fixture(scope="module")
def bf16_server(tiny_rm, server_args):
    from verl_vllm_rm.replicas.launcher import running_server

    args = list(server_args)
    args[args.index("--dtype") + 1] = "bfloat16"
    with running_server(tiny_rm, [*args, "--enable-weight-updates"]) as server:
        yield server


@pytest.mark.server  # the bf16 server
def test_a_bf16_servers_inventory_keeps_the_head_fp32_and_every_backbone_matrix_bf16(bf16_server):
    params, head_patterns = inventory_dtypes(bf16_server.url)
    assert mixed_precision_breaches(params, head_patterns, "bfloat16") == []
    assert params["score.weight"]["dtype"] == "float32"
    print("INVENTORY bf16: float32 weights", sorted(n for n, e in params.items() if e["dtype"] == "float32"))


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_a_bf16_server_scores_like_the_trainers_bf16_forward_within_the_bound(ray_cluster, bf16_server, tiny_rm,
                                                                             rollout, probe_ids, mode):
    """Each weight travels in the dtype the inventory names (the server refuses any other), whatever the CPU kept
    wider."""
    spread = trained_in_bf16(bf16_server.url, tiny_rm, rollout, probe_ids, mode)
    assert spread > FP32_MAX_ABS_DIFF  # both sides really compute in bf16 (an fp32 side would agree to 1e-5)
