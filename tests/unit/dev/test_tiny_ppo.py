"""``verl-vllm-rm tiny-ppo``'s run set-up (``dev/tiny_ppo.py``), in-process: bad options refused, verl's trainer mode
chosen, an RM directory without a model or a tokenizer without EOS refused before anything starts, the CLI's exit
code on failure, and the overrides of managed replicas. (Its main_ppo runs on the real server:
tests/integration/dev/test_tiny_ppo.py.)"""

from __future__ import annotations
from pathlib import Path
import pytest


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"online": "sometimes"}, "--online must be one of"),
    ({"steps": 0}, "--steps must be >= 1"),
    ({"replicas": -1}, "--replicas must be >= 0"),
    ({"replicas": 2, "server_url": "http://127.0.0.1:8001"}, "cannot go with --server-url"),
    ({"mode": "fully_async"}, "--mode must be one of"),
    ({"rollout_token_delay_s": -1.0}, "rollout_token_delay_s must be >= 0 seconds, got -1.0"),
])
def test_bad_options_are_refused(tmp_path, kwargs, message):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig

    with pytest.raises(ValueError, match=message):
        TinyPPOConfig(tmp_path, **kwargs)


@pytest.mark.parametrize(("online", "mode", "expected"), [
    ("off", "sync", "vllm_rm"), ("off", "separate_async", "vllm_rm_separate_async"),
    ("lora", "sync", "vllm_rm_online"), ("lora", "colocate_async", "vllm_rm_online_colocate_async"),
])
def test_the_trainer_mode_is_ours_over_verls(tmp_path, online, mode, expected):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, trainer_mode

    assert trainer_mode(TinyPPOConfig(tmp_path, online=online, mode=mode)) == expected


def test_an_rm_dir_without_a_model_is_refused_before_anything_starts(tmp_path):
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, TinyPPOError, run_tiny_ppo

    with pytest.raises(TinyPPOError, match=r"--rm .*: no config.json there; give a \*ForSequenceClassification "
                                           r"checkpoint dir"):
        run_tiny_ppo(TinyPPOConfig(tmp_path / "work", rm=str(tmp_path)), on_step=None)
    assert not (tmp_path / "work" / "main_ppo.log").exists()


def test_an_rm_whose_tokenizer_has_no_eos_is_refused_before_the_policy_is_built(tmp_path, tiny_rm):
    """The tiny policy shares the RM's tokenizer and stops generating at its EOS token."""
    import shutil

    from transformers import AutoTokenizer

    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, run_tiny_ppo

    rm = tmp_path / "rm-without-eos"
    shutil.copytree(tiny_rm, rm)
    tokenizer = AutoTokenizer.from_pretrained(rm)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(rm)
    with pytest.raises(ValueError, match=rf"the tokenizer in {rm} has no EOS token; the policy needs one to stop "
                                         r"generating: set eos_token in its tokenizer_config.json"):
        run_tiny_ppo(TinyPPOConfig(tmp_path / "work", rm=str(rm)), on_step=None)
    assert not (tmp_path / "work" / "tiny-policy" / "config.json").exists()


def test_cli_reports_failures_with_exit_code_1(tmp_path):
    import subprocess
    import sys

    cli = Path(sys.executable).parent / "verl-vllm-rm"
    run = subprocess.run([str(cli), "tiny-ppo", "--rm", str(tmp_path), "--work-dir", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "tiny-ppo: --rm" in run.stderr and "no config.json" in run.stderr


def test_managed_replicas_serve_the_rm_and_take_the_online_publishes(compose_config):
    """``--replicas N``: the run's config has no server of ours; the RM is on N replicas the plugin starts (weight
    updates enabled when the RM trains online) and the online RM publishes to every one of them."""
    from verl_vllm_rm.dev.tiny_ppo import Inputs, TinyPPOConfig, main_ppo_overrides
    from verl_vllm_rm.plugin.online_mode import online_rm_config
    from verl_vllm_rm.scoring.options import run_reward_models

    inputs = Inputs(Path("/m/rm"), Path("/m/policy"), Path("/d/train.parquet"), Path("/d/val.parquet"))
    for online in ("off", "head_only"):
        overrides = main_ppo_overrides(TinyPPOConfig("/tmp/w", online=online, replicas=2), inputs, None)
        assert not any("server_url" in o for o in overrides)
        config = compose_config([o for o in overrides if not o.startswith("hydra.")])
        (rm,) = run_reward_models(config)
        assert (rm.replicas.model, rm.replicas.num_replicas) == ("/m/rm", 2)
        assert ("--enable-weight-updates" in rm.replicas.server_args) == (online != "off")
    assert online_rm_config(config).reward_model == rm.name
