"""Ray's prestarted workers on a CPU run: Ray's default against ``RAY_prestart_worker_first_driver=0``.

    .venv/bin/python benchmarks/bench_ray_prestart.py [--actors 6] [--repeats 3]

Writes ``benchmarks/results/ray_prestart.json`` (machine, date, per setting: idle workers left, CPU seconds of the
cluster's worker processes, seconds until every actor answered; ratios).

Why: when a driver connects, Ray starts idle Python workers ahead of any task (``ray::IDLE``), each importing Ray.
verl's processes are actors: each gets a worker process of its own, started when the actor is created, so on a
CPU run the prestarted workers mostly stay idle until the cluster stops, and their start-up takes CPU the run's
own processes need. ``tiny-ppo`` and ``make test`` therefore give their processes
``RAY_prestart_worker_first_driver=0`` (``verl_vllm_rm.dev.cpu_names.CPU_RUN_ENV``), which Ray reads when its
raylet starts.

Workload, in a fresh process per measurement (the raylet reads the variable at its start): a local cluster as the
CPU profile starts one (16 logical CPUs, no dashboard, a job runtime env), ``--actors`` actors of one CPU created at
once (verl's TaskRunner, workers and rollout are actors), each answering a call; then 10 s for any worker still
starting. The median of ``--repeats`` runs is kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).parent / "results" / "ray_prestart.json"
PRESTART = "RAY_prestart_worker_first_driver"
SETTINGS = {"Ray's default": None, f"{PRESTART}=0": "0"}

CLUSTER = """
import json, sys, time
import psutil, ray

ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"RUN": "1"}})

@ray.remote(num_cpus=1)
class Actor:
    def ping(self):
        return 1

start = time.perf_counter()
actors = [Actor.remote() for _ in range(int(sys.argv[1]))]
ray.get([actor.ping.remote() for actor in actors])
ready_s = time.perf_counter() - start
time.sleep(10)
titles, cpu = [], 0.0
for proc in psutil.Process().children(recursive=True):  # this cluster's alone: its raylet is this driver's child
    try:
        command, times = " ".join(proc.cmdline()), proc.cpu_times()
    except psutil.Error:
        continue
    if command.startswith("ray::") or "default_worker.py" in command:
        titles.append(command.split()[0])
        cpu += times.user + times.system
print(json.dumps({"ready_s": ready_s, "idle_workers": titles.count("ray::IDLE"), "worker_processes": len(titles),
                  "worker_cpu_s": cpu}))
ray.shutdown()
"""


def measure(actors: int, value: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != PRESTART}
    if value is not None:
        env[PRESTART] = value
    out = subprocess.run([sys.executable, "-c", CLUSTER, str(actors)], env=env, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):  # the settings alternate, so a drift of the machine meets both
        for name, value in SETTINGS.items():
            runs[name].append(measure(args.actors, value))
    medians = {name: {key: round(statistics.median(r[key] for r in rs), 3) for key in rs[0]}
               for name, rs in runs.items()}
    default, off = (medians[name] for name in SETTINGS)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cores": os.cpu_count()},
        "workload": f"a local Ray cluster (16 logical CPUs, no dashboard, a job runtime env), {args.actors} actors "
                    f"of 1 CPU answering one call, then 10 s; median of {args.repeats}",
        "median": medians,
        "runs": runs,
        "default_over_off": {"worker_cpu_s": round(default["worker_cpu_s"] / off["worker_cpu_s"], 2),
                             "ready_s": round(default["ready_s"] / off["ready_s"], 2)},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
