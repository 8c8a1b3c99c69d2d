"""A driver process owning a fleet (its own Ray cluster) is SIGKILLed: nothing of the fleet is left. Apart from
test_fleet.py so that module's two replicas are gone before this one starts a third (CI's memory)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from process_helpers import pid_alive, wait_for_no_orphaned_engines, wait_until
from repo_paths import SUPPORT

pytestmark = [pytest.mark.server, pytest.mark.ray]


def test_killing_the_driver_leaves_no_server_and_no_actor(tiny_rm, server_args, tmp_path):
    """A driver process owning a fleet (its own Ray cluster) is SIGKILLed: Ray reaps its actors, each server
    sees its replica actor gone and exits with its engine."""
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys, time, ray
        sys.path.insert(0, {str(SUPPORT)!r})
        from ray_helpers import start_local_ray
        from verl_vllm_rm.replicas.fleet import fleet_for
        from verl_vllm_rm.replicas.options import ReplicaOptions
        start_local_ray(num_cpus=2, log_to_driver=True)
        fleet = fleet_for("rm", ReplicaOptions(model={tiny_rm!r}, num_replicas=1, server_args={tuple(server_args)!r}))
        ray.get(fleet.urls.remote())
        actors = ray.get(fleet.__ray_call__.remote(
            lambda f: [os.getpid(), *ray.get([r.__ray_call__.remote(lambda r: os.getpid()) for r in f.replicas])]))
        print(json.dumps({{"servers": ray.get(fleet.server_pids.remote()), "actors": actors}}), flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line, f"the driver exited ({proc.wait()}) before its fleet was up: its stderr is in the output above"
        pids = json.loads(line)
        assert len(pids["servers"]) == 1 and len(pids["actors"]) == 2
        assert all(pid_alive(p) for p in pids["servers"] + pids["actors"])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in pids["servers"]:
            wait_until(lambda: not pid_alive(pid), 60, f"server {pid} gone after its driver was killed")
        for pid in pids["actors"]:
            wait_until(lambda: not pid_alive(pid), 60, f"fleet/replica actor process {pid} gone with the driver")
        assert wait_for_no_orphaned_engines() == []  # Ray SIGKILLs the server: its engine follows (lifeline)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
