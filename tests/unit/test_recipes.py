"""Every recipe's trainer overrides compose with verl's own ``ppo_trainer`` config and resolve to our
manager with valid options (the recipes' dry-run mode), and every recipe runs for real: the same script
with its CPU profile (tiny models, 1 or 2 steps, verl's main_ppo on CPU through the harness). A recipe that
another one execs with more overrides (grpo_math_rm_weighted.sh, which grpo_math_online_rm.sh extends) runs
inside that one's run: its overrides are the first of that run's, checked here, and it pays no main_ppo start-up
of its own: the in-process tests (no server; those on the real server: tests/integration/test_recipes.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from recipe_files import EXTENDED_BY, RECIPES
from repo_paths import REPO
from verl.trainer.ppo.reward import resolve_reward_manager_cls

from verl_vllm_rm.scoring.manager import VLLMRewardManager
from verl_vllm_rm.scoring.options import parse_options


def recipe_overrides(path: Path) -> list[str]:
    env = dict(os.environ, VERL_VLLM_RM_DRY_RUN="1", RM_PATH="/models/rm")
    out = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_there_are_recipes():
    assert len(RECIPES) >= 2


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_resolves_to_vllm_rm(recipe, compose_config):
    overrides = recipe_overrides(recipe)
    assert "reward.reward_manager.name=vllm_rm" in overrides
    cfg = compose_config(overrides)
    assert resolve_reward_manager_cls(cfg) is VLLMRewardManager
    options = parse_options(OmegaConf.to_container(cfg.reward.reward_kwargs, resolve=True))
    assert options.rm.client.server_url == ["http://127.0.0.1:8001"]
    assert not cfg.reward.reward_model.enable  # verl's own RM path would bypass vllm_rm


def test_a_recipe_another_one_extends_runs_in_its_run():
    """The extending recipe passes its overrides after the extended one's: main_ppo gets every setting of the
    extended script first, in its order (values from the same script, under the extending one's environment: the
    online recipe exports N_GPUS=6), so the extending recipe's run is also the extended one's."""
    assert EXTENDED_BY, "no recipe extends another: every recipe needs its own run"
    for inner, outer in EXTENDED_BY.items():
        inner_keys, outer_keys = ([o.split("=", 1)[0] for o in recipe_overrides(path)] for path in (inner, outer))
        assert outer_keys[:len(inner_keys)] == inner_keys, (inner.name, outer.name)
        assert len(outer_keys) > len(inner_keys)


@pytest.mark.parametrize(("env", "gpus"), [
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "RM_GPUS": "7"}, "0,1,2,3,4,5,6"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "RM_GPUS": "2,5"}, "0,1,3,4,6,7"),
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7", "RM_GPUS": "7"}, "4,5,6"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "RM_GPUS": "7", "TRAIN_GPUS": "0,1"}, "0,1"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, ""),  # no server GPU named: nothing to restrict
])
def test_verl_never_gets_the_reward_servers_gpu(env, gpus):
    """Ray does not know the server holds RM_GPUS; the recipes hide them from the verl run."""
    common = REPO / "recipes" / "common.sh"
    run_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "RM_GPUS", "TRAIN_GPUS")}
    out = subprocess.run(["bash", "-c", f"source {common}; train_gpus"], env={**run_env, **env},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == gpus


def run_recipe_expecting_failure(env: dict, recipe: Path = RECIPES[0]) -> str:
    """Run a recipe that must stop before anything starts; its stderr."""
    base = {k: v for k, v in os.environ.items() if k not in ("RM_SERVER_URL", "VERL_VLLM_RM_SERVER_PYTHON")}
    bin_dir = str(Path(sys.executable).parent)  # python3 = the trainer environment (.venv)
    run = subprocess.run(["bash", str(recipe)], env={**base, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                                     "RM_PATH": "/models/rm", **env},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    return run.stderr


def test_recipes_name_a_missing_server_environment(tmp_path):
    err = run_recipe_expecting_failure({"VERL_VLLM_RM_SERVER_PYTHON": str(tmp_path / "nowhere" / "python")})
    assert f"no server environment: {tmp_path}/nowhere/python does not exist; set VERL_VLLM_RM_SERVER_PYTHON" in err


def test_recipes_default_to_the_clones_server_environment(tmp_path):
    """Without the variable the server python is .venv-server of the recipes' clone: a copy of the recipes in a
    directory without one names that path."""
    import shutil

    shutil.copytree(RECIPES[0].parent, tmp_path / "recipes")
    err = run_recipe_expecting_failure({}, tmp_path / "recipes" / RECIPES[0].name)
    assert f"no server environment: {tmp_path}/.venv-server/bin/python does not exist" in err
    assert "`make setup DEVICE=gpu` on GPUs" in err


def test_recipes_name_what_the_server_environment_lacks():
    err = run_recipe_expecting_failure({"VERL_VLLM_RM_SERVER_PYTHON": sys.executable})  # the trainer's: no vllm
    assert f"the server environment ({sys.executable}) lacks: vllm;" in err


def test_recipes_name_a_trainer_environment_without_verl(tmp_path):
    """python3 on PATH is the server environment's (no verl): the recipe says to activate the trainer's."""
    from verl_vllm_rm.replicas.launcher import find_server_python

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").symlink_to(find_server_python())
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    err = run_recipe_expecting_failure(env)
    assert "the trainer environment (python3) lacks: verl; activate the trainer environment first" in err
