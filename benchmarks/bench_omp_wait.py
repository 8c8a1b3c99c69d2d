"""PyTorch's OpenMP threads on shared cores: libgomp's default wait policy against ``OMP_WAIT_POLICY=PASSIVE``.

    .venv/bin/python benchmarks/bench_omp_wait.py [--steps 30] [--repeats 3]

Writes ``benchmarks/results/omp_wait.json`` (machine, date, seconds per condition and policy, ratios).

Why: a CPU run of this package (``make demo``, ``tiny-ppo``, ``make test``) puts the reward server, verl's
trainer, the rollout and (in the tests) a second pytest worker on the same few cores. libgomp keeps a thread that
waits for the others spinning on its core for a while before it sleeps; a core held by a spinning thread is one
another process needs. ``tiny-ppo`` and ``make test`` therefore start their processes with
``OMP_WAIT_POLICY=PASSIVE`` (``verl_vllm_rm.dev.cpu_names.CPU_RUN_ENV``).

Workload: building the tiny policy (``dev/tiny_policy.build_tiny_policy``, the first part of every ``tiny-ppo``
run: its supervised warm-up), ``--steps`` steps, with as many intra-op threads as the machine has cores
(PyTorch's default), in a fresh process per measurement (libgomp reads the variable once, when it loads). Each is
timed twice: on an otherwise idle machine, and beside one busy process per core (a pure-Python loop, standing for
the other processes of a run). The fastest of ``--repeats`` runs is kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "omp_wait.json"
POLICIES = {"libgomp default": None, "PASSIVE": "PASSIVE"}

WARM_UP = """
import sys, tempfile, time
from dataclasses import replace
from pathlib import Path
import torch, transformers  # imported before the clock starts
from verl_vllm_rm.dev.tiny_policy import SFTWarmUp, TinyPolicySpec, build_tiny_policy

rm_dir, steps = sys.argv[1], int(sys.argv[2])
with tempfile.TemporaryDirectory() as out:
    start = time.perf_counter()
    build_tiny_policy(rm_dir, Path(out) / "policy", replace(TinyPolicySpec(), sft=SFTWarmUp(steps=steps)))
    print(time.perf_counter() - start)
"""


def busy(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def warm_up_seconds(rm_dir: Path, steps: int, policy: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", WARM_UP, str(rm_dir), str(steps)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def measure(rm_dir: Path, steps: int, repeats: int, busy_processes: int) -> dict[str, float]:
    """The fastest of ``repeats`` warm-ups per policy, beside ``busy_processes`` busy processes."""
    seconds = {}
    for name, policy in POLICIES.items():
        runs = []
        for _ in range(repeats):
            hogs = [multiprocessing.Process(target=busy, args=(time.monotonic() + 600,), daemon=True)
                    for _ in range(busy_processes)]
            for hog in hogs:
                hog.start()
            try:
                runs.append(warm_up_seconds(rm_dir, steps, policy))
            finally:
                for hog in hogs:
                    hog.terminate()
                    hog.join()
        seconds[name] = round(min(runs), 3)
    return seconds


def main() -> None:
    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        rm_dir = build_tiny_rm(Path(tmp) / "rm")
        conditions = {"idle": measure(rm_dir, args.steps, args.repeats, 0),
                      f"beside {cores} busy processes": measure(rm_dir, args.steps, args.repeats, cores)}
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cores": cores},
        "workload": f"build_tiny_policy, {args.steps} SFT steps, {cores} intra-op threads; fastest of "
                    f"{args.repeats}",
        "seconds": conditions,
        "default_over_passive": {name: round(s["libgomp default"] / s["PASSIVE"], 2)
                                 for name, s in conditions.items()},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
