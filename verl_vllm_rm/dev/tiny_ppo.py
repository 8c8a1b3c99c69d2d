"""``verl-vllm-rm tiny-ppo``: verl's real ``main_ppo`` GRPO with ``vllm_rm``, on CPU.

A tiny policy (built on the RM's tokenizer) learns the tiny task from the reward
model served by the real vLLM engine. The run is ``python -m verl.trainer.main_ppo``
itself, made to run on CPU by :mod:`verl_vllm_rm.dev.cpu_harness`; this module only
builds the inputs, starts (and always stops) the reward server, follows verl's
metrics file for progress, and writes ``WORK_DIR/summary.json`` and the run's report (``report.png``,
``report.txt``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from verl_vllm_rm.dev.cpu_names import BACKEND_NAME, GENERATION_LOG_ENV, HARNESS_MODULE
from verl_vllm_rm.dev.ppo_report import print_step, read_metrics, summarize
from verl_vllm_rm.monitor.report import write_report

ONLINE_MODES = ("off", "head_only", "lora", "full")
ONLINE_MODULE = "verl_vllm_rm.online.trainer_mode"
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]

#: Hydra overrides verl 0.9.1 needs on CPU (settings, not patches; the patches are in cpu_harness.patches).
CPU_OVERRIDES = [
    f"actor_rollout_ref.rollout.name={BACKEND_NAME}",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # one rollout process per replica
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    # verl's pools reserve one accelerator per worker: one logical Ray GPU is the worker slot.
    "+ray_kwargs.ray_init.num_gpus=1",
    # With num_cpus=2 the run hung (verl's actors reserve CPUs); logical CPUs, not cores.
    "ray_kwargs.ray_init.num_cpus=16",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    # HFModelConfig defaults to flash_attention_2 and remove-padding kernels; FSDP1 wants a device index.
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=False",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "actor_rollout_ref.ref.fsdp_config.dtype=float32",
    "data.dataloader_num_workers=0",
]


#: The reward GRPO trains on: the RM's score + gsm8k correctness + 2 * the tiny task's answer form. The
#: form rule keeps the tiny policy from settling on strings the tiny RM happens to over-score.
FORM_WEIGHT = 2.0
FORM_PATTERN = "</think> The answer is .* #### "
REWARDS = ("{components:[rubric,verifiable,format],weights:{rubric:1.0,verifiable:1.0,format:%s},"
           "format:{pattern:'%s'}}" % (FORM_WEIGHT, FORM_PATTERN))


class TinyPPOError(RuntimeError):
    """main_ppo (or the reward server) failed; the message names the cause and the log."""


@dataclass
class TinyPPOConfig:
    work_dir: Path
    steps: int = 8
    rm: str | None = None  # None: the tiny RM, built and trained offline in work_dir
    policy: str | None = None  # None: the tiny policy, built on the RM's tokenizer in work_dir
    online: str = "off"
    extra_overrides: list[str] = field(default_factory=list)
    server_url: str | None = None  # None: start a server on the RM (and stop it at the end)
    rm_train_seconds: float = 60.0
    seed: int = 0
    batch_prompts: int = 4
    group_size: int = 4
    validate: bool = True

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir).resolve()
        if self.online not in ONLINE_MODES:
            raise ValueError(f"--online must be one of {ONLINE_MODES}, got {self.online!r}")
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")


@dataclass
class Inputs:
    rm: Path
    policy: Path
    train: Path
    val: Path


def prepare_inputs(cfg: TinyPPOConfig) -> Inputs:
    """The RM (given or trained offline), the tiny policy on its tokenizer, and the dataset."""
    from verl_vllm_rm.dev.tiny_policy import TinyPolicySpec, build_tiny_policy
    from verl_vllm_rm.dev.tiny_task import train_tiny_rm, write_dataset

    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    if cfg.rm is None:
        rm = cfg.work_dir / "tiny-rm-trained"
        if not (rm / "config.json").exists():
            rm = train_tiny_rm(cfg.work_dir, cfg.rm_train_seconds, cfg.seed)
    else:
        rm = Path(cfg.rm).resolve()
        if not (rm / "config.json").exists():
            raise TinyPPOError(f"--rm {rm}: no config.json there; give a *ForSequenceClassification checkpoint dir")
    if cfg.policy is None:
        policy = build_tiny_policy(rm, cfg.work_dir / "tiny-policy", TinyPolicySpec(seed=cfg.seed))
    else:
        policy = Path(cfg.policy).resolve()
    train, val = write_dataset(cfg.work_dir / "data", seed=cfg.seed)
    return Inputs(rm, policy, train, val)


def cpu_profile(steps: int, batch_prompts: int = 4, group_size: int = 4, online: bool = False,
                external_modules: str | None = None) -> list[str]:
    """Overrides that turn any GRPO run into a tiny one verl runs on CPU (appended last, they win).

    ``make test`` runs every script in ``recipes/`` with these (``VERL_VLLM_RM_CPU_PROFILE=1``).
    ``external_modules`` (the harness first) also goes into Ray's runtime env, for recipes that set it
    there for workers on other nodes.
    """
    profile = [
        *CPU_OVERRIDES,
        f"data.train_batch_size={batch_prompts}",
        "data.max_prompt_length=48",
        "data.max_response_length=32",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_prompts}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        f"actor_rollout_ref.rollout.n={group_size}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        # verl starts 8 agent-loop and 8 reward-loop Ray workers by default (~0.5 GB each): 2 share 2 cores.
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "reward.num_workers=2",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console,file]",
    ]
    if online:
        profile.append("+online_rm.use_gpu=False")
    if external_modules:
        profile.append(f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='{external_modules}'")
    return profile


def main_ppo_overrides(cfg: TinyPPOConfig, inputs: Inputs, server_url: str) -> list[str]:
    """Every Hydra override of the run: the task, vllm_rm, the CPU profile, online RM, then the user's."""
    work = cfg.work_dir
    overrides = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={inputs.train}",
        f"data.val_files={inputs.val}",
        f"data.seed={cfg.seed}",
        f"actor_rollout_ref.model.path={inputs.policy}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "reward.reward_manager.name=vllm_rm",
        # reward/* metrics, alarms and a rollout dump with every reward component (vllm_rm_online has them too)
        f"trainer.v1.trainer_mode={'vllm_rm' if cfg.online == 'off' else 'vllm_rm_online'}",
        f"+reward.reward_kwargs.server_url={server_url}",
        f"+reward.reward_kwargs.rewards={REWARDS}",
        # verl 0.9.1's agent loop does not tell reward managers a sample is from validation, so "auto"
        # never fires in main_ppo; "always" scores the reference once per prompt group and step.
        "+reward.reward_kwargs.pairwise=always",
        "+reward.reward_kwargs.reference_source=extra_info:reference",
        "+reward.reward_kwargs.num_examine=0",
        *cpu_profile(cfg.steps, cfg.batch_prompts, cfg.group_size, online=cfg.online != "off"),
        "trainer.save_freq=-1",
        f"trainer.test_freq={cfg.steps if cfg.validate else -1}",
        f"trainer.val_before_train={cfg.validate}",
        f"trainer.rollout_data_dir={work / 'rollouts'}",
        f"trainer.default_local_dir={work / 'checkpoints'}",
        "trainer.project_name=verl_vllm_rm",
        "trainer.experiment_name=tiny_ppo",
        f"hydra.run.dir={work / 'hydra'}",
    ]
    if cfg.online != "off":
        overrides += [
            f"+online_rm.model_path={inputs.rm}",
            f"+online_rm.server_url={server_url}",
            f"+online_rm.training_mode={cfg.online}",
            "+online_rm.publish_every=1",
            "+online_rm.parity_every=1",
            # The RM learns from a trusted rule, never from its own score: best vs worst answer form per group.
            "+online_rm.reward_key=format",
            "+online_rm.lr=1e-4",
        ]
    return overrides + list(cfg.extra_overrides)


def main_ppo_env(cfg: TinyPPOConfig) -> dict[str, str]:
    modules = [HARNESS_MODULE] + ([ONLINE_MODULE] if cfg.online != "off" else [])
    return dict(
        os.environ,
        VERL_USE_EXTERNAL_MODULES=",".join(modules),
        VERL_FILE_LOGGER_PATH=str(cfg.work_dir / "metrics.jsonl"),
        **{GENERATION_LOG_ENV: str(cfg.work_dir / "generations.jsonl")},
        TOKENIZERS_PARALLELISM="false",
        RAY_DEDUP_LOGS="0",
    )


def _runtime_version(url: str) -> int | None:
    from verl_vllm_rm.http import HttpError, get_json

    try:
        return int(get_json(f"{url}/runtime_version", timeout_s=5.0)["version"])
    except (HttpError, ValueError, KeyError):
        return None


def run_main_ppo(cfg: TinyPPOConfig, inputs: Inputs, server_url: str,
                 on_step: Callable[[int, dict, int | None], None] | None = None,
                 overrides: list[str] | None = None) -> dict[int, int | None]:
    """Run main_ppo to the end; ``on_step(step, metrics, rm_version)`` as each step's metrics land.

    ``overrides`` replaces :func:`main_ppo_overrides` (a benchmark's variants). Returns the server's
    ``/runtime_version`` read right after each step.
    """
    for stale in ("metrics.jsonl", "generations.jsonl"):
        (cfg.work_dir / stale).unlink(missing_ok=True)
    log_path = cfg.work_dir / "main_ppo.log"
    if overrides is None:
        overrides = main_ppo_overrides(cfg, inputs, server_url)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    (cfg.work_dir / "main_ppo.cmd").write_text(" \\\n  ".join(cmd) + "\n")
    versions: dict[int, int | None] = {}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=main_ppo_env(cfg),
                                cwd=cfg.work_dir, start_new_session=True)
        try:
            seen = 0
            while True:
                done = proc.poll() is not None
                for step, metrics in read_metrics(cfg.work_dir)[seen:]:
                    seen += 1
                    if step in versions or "training/global_step" not in metrics:
                        continue  # the val_before_train line has no training metrics
                    versions[step] = _runtime_version(server_url)
                    if on_step:
                        on_step(step, metrics, versions[step])
                if done:
                    break
                time.sleep(0.25)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    if proc.returncode != 0:
        raise TinyPPOError(f"main_ppo exited with code {proc.returncode}: {first_error(log_path)}\n"
                           f"(full log: {log_path})")
    return versions


def first_error(log_path: Path) -> str:
    """The most telling line of a failed run's log: the last exception raised, else its last line."""
    lines = Path(log_path).read_text(errors="replace").splitlines()
    markers = ("Error:", "Exception:", "error:")
    errors = [line.strip() for line in lines if any(m in line for m in markers) and "Warning" not in line]
    return errors[-1] if errors else (lines[-1].strip() if lines else "(empty log)")


def run_tiny_ppo(cfg: TinyPPOConfig, on_step: Callable[[int, dict, int | None], None] | None = print_step) -> dict:
    """Build the inputs, serve the RM, run main_ppo; returns the summary (also in ``summary.json``)."""
    from verl_vllm_rm.replicas.launcher import ServerStartError, start_server

    inputs = prepare_inputs(cfg)
    server = None
    url = cfg.server_url
    if url is None:
        args = SERVER_ARGS + (["--enable-weight-updates"] if cfg.online != "off" else [])
        try:
            server = start_server(inputs.rm, args, log_path=cfg.work_dir / "reward_server.log")
        except ServerStartError as e:
            raise TinyPPOError(f"the reward server on {inputs.rm} did not start: {e}") from e
        url = server.url
    try:
        versions = run_main_ppo(cfg, inputs, url, on_step)
    finally:
        if server is not None:
            server.stop()
    summary = summarize(cfg.work_dir, cfg.online, versions)
    summary.update(rm=str(inputs.rm), policy=str(inputs.policy), server_url=url)
    write_report(cfg.work_dir)  # report.png and report.txt, what `verl-vllm-rm report WORK_DIR` writes
    (cfg.work_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    # ``python -m verl_vllm_rm.dev.tiny_ppo --cpu-profile [STEPS]``: the CPU profile, one override per line
    # (recipes/common.sh appends it under VERL_VLLM_RM_CPU_PROFILE=1).
    if sys.argv[1:2] != ["--cpu-profile"]:
        sys.exit("usage: python -m verl_vllm_rm.dev.tiny_ppo --cpu-profile [STEPS]  (the run itself: verl-vllm-rm tiny-ppo)")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    modules = os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    print("\n".join(cpu_profile(steps, online=ONLINE_MODULE in modules, external_modules=modules or None)))
