"""``verl-vllm-rm check`` against the real server, and the embedding-health rules."""

import json
import subprocess
import sys


from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tiny_rm


def run_check(url, model):
    proc = subprocess.run([sys.executable, "-m", "verl_vllm_rm.cli", "check", "--url", url, "--model", str(model),
                           "--probes", "40"], capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(proc.stdout)


def test_check_passes_on_the_served_model(rm_server, tiny_rm):
    code, report = run_check(rm_server.url, tiny_rm)
    assert code == 0, report
    parity = report["parity"]
    assert parity["probes"] == 40 and parity["max_abs_diff"] < 1e-4 and parity["mult_error"] < 1.0001
    assert parity["batch_invariance_max_diff"] < 1e-4 and parity["repeat_max_diff"] < 1e-4
    assert report["max_model_len"] == {"max_model_len": 512, "overlong_refused": True, "truncated_scored": True,
                                       "dropped": 1, "ok": True}
    assert report["embeddings"][0]["ok"]


def test_check_fails_against_another_model(rm_server, tmp_path):
    other = build_tiny_rm(tmp_path / "other", TinyRMSpec(seed=3))
    code, report = run_check(rm_server.url, other)
    assert code == 1 and not report["parity"]["ok"] and report["parity"]["mult_error"] > 1.05
