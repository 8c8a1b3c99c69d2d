"""The reward server refuses a ``--model`` path that is not there before it imports vLLM (the check itself:
tests/unit/server/test_model_path.py)."""

from __future__ import annotations

import subprocess

from verl_vllm_rm.replicas.launcher import find_server_python


def test_the_server_refuses_a_missing_model_path_without_importing_vllm(tmp_path):
    """``-X importtime`` lists every module the process imported: none of vLLM's (its import is ~10 s of CPU, so a
    replica with a mistyped path used to hold a run's set-up that long)."""
    missing = tmp_path / "no-such-rm"
    proc = subprocess.run([find_server_python(), "-X", "importtime", "-m", "verl_vllm_rm.server",
                           "--model", str(missing), "--enforce-eager"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert lines[-1] == (f"verl-vllm-rm: --model {missing} does not exist: give the folder of a local checkpoint "
                         "(with its config.json), or a hub model id")
    imported = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    assert "verl_vllm_rm.server.model_path" in imported
    assert not [name for name in imported if name.split(".")[0] in ("vllm", "torch")], imported
