"""Every recipe's trainer overrides compose with verl's own ``ppo_trainer`` config and resolve to our
manager with valid options (the recipes' dry-run mode), and every recipe runs for real: the same script
with its CPU profile (tiny models, 1 or 2 steps, verl's main_ppo on CPU through the harness). A recipe that
another one execs with more overrides (grpo_math_rm_weighted.sh, which grpo_math_online_rm.sh extends) runs
inside that one's run: its overrides are the first of that run's, checked here, and it pays no main_ppo start-up
of its own."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_files import EXTENDED_BY, RECIPES

#: the recipes main_ppo runs from their own script (the others run inside the one that extends them)
OUTERMOST = [p for p in RECIPES if p not in EXTENDED_BY]


@pytest.mark.server
@pytest.mark.ray
@pytest.mark.parametrize("recipe", OUTERMOST, ids=[p.name for p in OUTERMOST])
def test_recipe_runs_on_cpu(recipe, tmp_path, tiny_rm, tiny_task, rm_server, online_rm_server):
    """The exact script users start, with VERL_VLLM_RM_CPU_PROFILE=1: one GRPO step of verl's main_ppo
    (VERL_VLLM_RM_CPU_STEPS=1), two for the online recipe, whose run max_idle_steps stops at step 2: its RM
    never gets a pair here."""
    online = "online" in recipe.name
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, VERL_VLLM_RM_CPU_PROFILE="1", VERL_VLLM_RM_CPU_STEPS="2" if online else "1",
               PATH=f"{bin_dir}:{os.environ['PATH']}",
               MODEL=str(tiny_task["policy"]), DATA=str(tiny_task["data"]), RM_PATH=tiny_rm,
               RM_SERVER_URL=(online_rm_server if online else rm_server).url, RM_MODE="head_only",
               VERL_FILE_LOGGER_PATH=str(tmp_path / "metrics.jsonl"), TOKENIZERS_PARALLELISM="false")
    # The online recipe's RM gets no preference pair (min_reward_gap above any correctness gap): the run says so at
    # once, counts it in the metrics, and max_idle_steps=2 stops it at step 2 with the reason.
    idle = ["+online_rm.min_reward_gap=1.0", "+online_rm.max_idle_steps=2"] if online else []
    run = subprocess.run(["bash", str(recipe), f"hydra.run.dir={tmp_path / 'hydra'}",
                          f"trainer.default_local_dir={tmp_path / 'checkpoints'}", "trainer.save_freq=-1", *idle],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    output = run.stdout + run.stderr
    metrics = tmp_path / "metrics.jsonl"
    assert metrics.exists(), f"{recipe.name} logged no step (exit code {run.returncode}):\n{output[-6000:]}"
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    trained = [s for s in steps if "training/global_step" in s["data"]]
    assert all(s["data"]["critic/rewards/mean"] == s["data"]["critic/rewards/mean"] for s in trained)  # not NaN
    if not online:
        assert run.returncode == 0, f"{recipe.name} failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
        assert [s["step"] for s in trained] == [1]
        return
    assert run.returncode != 0 and [s["step"] for s in trained] == [1], output[-4000:]
    assert {k: trained[0]["data"][k] for k in ("rm/pairs", "rm/trained", "rm/idle_steps")} == {
        "rm/pairs": 0.0, "rm/trained": 0.0, "rm/idle_steps": 1.0}
    assert "online RM: no preference pairs at PPO step 1, so the RM did not train" in output
    assert "online_rm.reward_key=['verifiable_score']" in output
    assert ("RewardModelIdleError: online RM: no preference pairs at PPO step 2" in output
            and "That is 2 step(s) in a row, online_rm.max_idle_steps=2: stopping the run" in output), output[-4000:]
