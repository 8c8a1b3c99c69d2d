"""`make demo` end to end (short RM training, 2 GRPO steps): the README's first command (and docs/quickstart.md's)
must keep working."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_vllm_rm.dev.demo import RM_RANKS
from verl_vllm_rm.dev.ppo_report import read_metrics

pytestmark = [pytest.mark.server, pytest.mark.ray]


def test_demo_runs_the_whole_loop(tmp_path):
    cli = Path(sys.executable).parent / "verl-vllm-rm"
    work = tmp_path / "demo"
    run = subprocess.run([str(cli), "demo", "--workdir", str(work), "--train-seconds", "5", "--steps", "2"],
                         capture_output=True, text=True, timeout=1200)
    out = run.stdout
    assert run.returncode == 0, f"demo failed:\n{out[-3000:]}\n{run.stderr[-3000:]}"
    for stage in ("1/4", "2/4", "3/4", "4/4"):
        assert f"=== {stage} ===" in out
    summary = json.loads((work / "summary.json").read_text())
    assert [s["rm_version"] for s in summary["steps"]] == [1, 2]  # the RM published after every step
    assert all(s["parity_max_abs"] <= 1e-4 for s in summary["steps"])
    assert all(s["rm_trained"] and s["rm_pairs"] > 0 for s in summary["steps"])  # never silently idle
    trained = [m for _, m in read_metrics(work) if "rm/trained" in m]
    assert len(trained) == 2 and all(m["rm/ranks"] == RM_RANKS == 2 for m in trained)  # lora, sharded over 2
    assert "rm step" in out and "online RM, pairs per step: 1: " in out  # the table's column, the report's line
    assert "validation at step 0: " in out and "win=" in out and "win_and=" in out
    assert (work / "report.png").is_file() and (work / "main_ppo.log").is_file()
    assert "the run's report" in out and "2 training steps (1..2)" in out and "online RM drift on the probe set" in out
    assert f"everything stays in {work}" in out
