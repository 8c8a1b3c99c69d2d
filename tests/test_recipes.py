"""Every recipe's trainer overrides compose with verl's own ``ppo_trainer`` config and
resolve to our manager with valid options (no GPU needed: the recipes' dry-run mode)."""

import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl.trainer.ppo.reward import resolve_reward_manager_cls
from verl_vllm_rm.config import parse_options
from verl_vllm_rm.manager import VLLMRewardManager

RECIPES = sorted(p for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.sh") if p.name != "common.sh")


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
    assert options.server_url == ["http://127.0.0.1:8001"]
    assert not cfg.reward.reward_model.enable  # verl's own RM path would bypass vllm_rm


@pytest.mark.parametrize(("env", "gpus"), [
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "RM_GPUS": "7"}, "0,1,2,3,4,5,6"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "RM_GPUS": "2,5"}, "0,1,3,4,6,7"),
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7", "RM_GPUS": "7"}, "4,5,6"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "RM_GPUS": "7", "TRAIN_GPUS": "0,1"}, "0,1"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, ""),  # no server GPU named: nothing to restrict
])
def test_verl_never_gets_the_reward_servers_gpu(env, gpus):
    """Ray does not know the server holds RM_GPUS; the recipes hide them from the verl run."""
    common = Path(__file__).resolve().parents[1] / "recipes" / "common.sh"
    run_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "RM_GPUS", "TRAIN_GPUS")}
    out = subprocess.run(["bash", "-c", f"source {common}; train_gpus"], env={**run_env, **env},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == gpus
