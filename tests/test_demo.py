"""`make demo` end to end (shorter RM training): the README's first command must keep working."""

import subprocess
import sys
from pathlib import Path


def test_demo_runs_the_whole_product(tmp_path):
    cli = Path(sys.executable).parent / "verl-vllm-rm"
    work = tmp_path / "demo"
    run = subprocess.run([str(cli), "demo", "--workdir", str(work), "--train-seconds", "5"],
                         capture_output=True, text=True, timeout=900)
    out = run.stdout
    assert run.returncode == 0, f"demo failed:\n{out[-3000:]}\n{run.stderr[-3000:]}"
    assert out.count("\nprompt: ") == 4, "one table per prompt group"
    assert "overall win rate vs reference: win=" in out
    assert "/runtime_version: 0 -> 1" in out
    assert "parity on 16 probes: max |server - trainer| =" in out and "(OK)" in out
    assert (work / "server.log").is_file() and f"stay in {work}" in out
