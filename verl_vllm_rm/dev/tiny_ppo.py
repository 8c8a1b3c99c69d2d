"""``verl-vllm-rm tiny-ppo``: verl's real ``main_ppo`` GRPO with ``vllm_rm``, on CPU.

A tiny policy (built on the RM's tokenizer) learns the tiny task from the reward
model served by the real vLLM engine. The run is ``python -m verl.trainer.main_ppo``
itself, made to run on CPU by :mod:`verl_vllm_rm.dev.cpu_harness`; this module only
builds the inputs, starts (and always stops) the reward server (or, with ``replicas``, lets
the plugin run the RM on replicas inside verl's Ray cluster), follows verl's
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

from verl_vllm_rm.dev.cpu_names import (GENERATION_LOG_ENV, HARNESS_MODULE, REWARD_CALL_LOG_ENV,
                                        RM_STEP_AFTER_A_FINISHED_GROUP_ENV, RM_STEP_LOG_ENV, ROLLOUT_TOKEN_DELAY_ENV,
                                        cpu_run_env)
from verl_vllm_rm.dev.cpu_profile import BASE_MODES, cpu_profile
from verl_vllm_rm.dev.ppo_report import print_step, read_metrics, summarize
from verl_vllm_rm.monitor.report import write_report

ONLINE_MODES = ("off", "head_only", "lora", "full")
# 256 MiB of KV cache, not the server's 2 GiB CPU default: the tiny task's sequences are under 100 tokens, and
# the server then takes ~1.6 GB (a 7B RM's fp32 KV, ~114 KB a token, still holds ~2,300 tokens).
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes",
               str(256 << 20)]

#: The reward GRPO trains on: the RM's score + gsm8k correctness + 2 * the tiny task's answer form. The
#: form rule keeps the tiny policy from settling on strings the tiny RM happens to over-score.
FORM_WEIGHT = 2.0
FORM_PATTERN = "</think> The answer is .* #### "
REWARDS = ("{components:[rubric,verifiable,format],weights:{rubric:1.0,verifiable:1.0,format:%s},"
           "format:{pattern:'%s'}}" % (FORM_WEIGHT, FORM_PATTERN))


#: What ranks a prompt group's responses into the online RM's preference pair, tried in order per group: the
#: trusted rules first (the answer form, then correctness); where both tie, the run's total reward, which includes
#: the RM's own score and so varies whatever the RM and its tokenizer (the RM then also learns from its own score).
PAIR_SOURCES = ("format", "verifiable_score", "rm_scores")


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
    server_url: str | list[str] | None = None  # None: start a server on the RM (and stop it at the end)
    replicas: int = 0  # > 0: no server of ours; the plugin runs the RM on this many replicas on verl's Ray cluster
    rm_train_seconds: float = 60.0
    seed: int = 0
    batch_prompts: int = 4
    group_size: int = 4
    validate: bool = True
    mode: str = "sync"  # verl's trainer mode: sync, colocate_async, separate_async
    # seconds the CPU rollout waits before each token (ROLLOUT_TOKEN_DELAY_ENV): generation as slow next to
    # training as on GPUs, so the async modes pause it mid-trajectory for their weight syncs (partial rollouts)
    rollout_token_delay_s: float = 0.0
    # the first RM step of an asynchronous trainer waits until a group of the next step's prompts has finished
    # (RM_STEP_AFTER_A_FINISHED_GROUP_ENV), so its publish always leaves a group for max_staleness to evict
    rm_step_after_a_finished_group: bool = False
    math_dapo_every: int = 0  # every such prompt is a math_dapo one (tiny_task.write_dataset); 0: gsm8k only

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir).resolve()
        if self.online not in ONLINE_MODES:
            raise ValueError(f"--online must be one of {ONLINE_MODES}, got {self.online!r}")
        if self.mode not in BASE_MODES:
            raise ValueError(f"--mode must be one of {BASE_MODES}, got {self.mode!r}")
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        if self.rollout_token_delay_s < 0:
            raise ValueError(f"rollout_token_delay_s must be >= 0 seconds, got {self.rollout_token_delay_s}")
        if self.replicas < 0 or (self.replicas and self.server_url is not None):
            raise ValueError(f"--replicas must be >= 0 and cannot go with --server-url, got {self.replicas} and "
                             f"{self.server_url!r}")


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
    train, val = write_dataset(cfg.work_dir / "data", seed=cfg.seed, math_dapo_every=cfg.math_dapo_every)
    return Inputs(rm, policy, train, val)


def server_args(cfg: TinyPPOConfig) -> list[str]:
    """The reward server's arguments: the CPU test set, plus weight updates when the RM trains online."""
    return SERVER_ARGS + (["--enable-weight-updates"] if cfg.online != "off" else [])


def reward_model_overrides(cfg: TinyPPOConfig, inputs: Inputs, server_url: str | list[str] | None) -> list[str]:
    """Where the RM is served: ``server_url`` (one server or a list), or (``cfg.replicas``) replicas the plugin
    starts; the online RM publishes to the same place (``online_rm.reward_model`` defaults to those replicas)."""
    if cfg.replicas:
        args = ",".join(f"'{a}'" for a in server_args(cfg))
        return [f"+reward.reward_kwargs.replicas={{model:'{inputs.rm}',num_replicas:{cfg.replicas},"
                f"server_args:[{args}]}}"]
    urls = server_url if isinstance(server_url, str) else f"[{','.join(server_url)}]"
    online = [f"+online_rm.server_url={urls}"] if cfg.online != "off" else []
    return [f"+reward.reward_kwargs.server_url={urls}", *online]


def trainer_mode(cfg: TinyPPOConfig) -> str:
    """Our trainer mode over verl's ``cfg.mode``: ``vllm_rm[_online]``, then ``_<mode>`` but for sync."""
    ours = "vllm_rm_online" if cfg.online != "off" else "vllm_rm"
    return ours if cfg.mode == "sync" else f"{ours}_{cfg.mode}"


def main_ppo_overrides(cfg: TinyPPOConfig, inputs: Inputs, server_url: str | list[str] | None) -> list[str]:
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
        f"trainer.v1.trainer_mode={trainer_mode(cfg)}",
        *reward_model_overrides(cfg, inputs, server_url),
        f"+reward.reward_kwargs.rewards={REWARDS}",
        # "always": win metrics in training too (one reference score per prompt group and step); "auto" would
        # give them in validation only (our trainer modes tag each validation prompt)
        "+reward.reward_kwargs.pairwise=always",
        "+reward.reward_kwargs.reference_source=extra_info:reference",
        "+reward.reward_kwargs.num_examine=0",
        *cpu_profile(cfg.steps, cfg.batch_prompts, cfg.group_size, online=cfg.online != "off", mode=cfg.mode),
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
            f"+online_rm.training_mode={cfg.online}",
            "+online_rm.publish_every=1",
            "+online_rm.parity_every=1",
            f"+online_rm.reward_key=[{','.join(PAIR_SOURCES)}]",
            "+online_rm.lr=1e-4",
        ]
    return overrides + list(cfg.extra_overrides)


def main_ppo_env(cfg: TinyPPOConfig) -> dict[str, str]:
    return dict(
        os.environ,
        VERL_USE_EXTERNAL_MODULES=HARNESS_MODULE,
        VERL_FILE_LOGGER_PATH=str(cfg.work_dir / "metrics.jsonl"),
        **{GENERATION_LOG_ENV: str(cfg.work_dir / "generations.jsonl"),
           REWARD_CALL_LOG_ENV: str(cfg.work_dir / "reward_calls.jsonl"),
           RM_STEP_LOG_ENV: str(cfg.work_dir / "rm_steps.jsonl"),
           ROLLOUT_TOKEN_DELAY_ENV: str(cfg.rollout_token_delay_s),
           RM_STEP_AFTER_A_FINISHED_GROUP_ENV: "1" if cfg.rm_step_after_a_finished_group else ""},
        TOKENIZERS_PARALLELISM="false",
        RAY_DEDUP_LOGS="0",
        **cpu_run_env(),
    )


def served_version(url: str | list[str] | None, metrics: dict) -> int | None:
    """The RM weight version served right after a step: the server's (of a list: the newest of those that
    answer), or, on managed replicas (no ``url``), the version the step published, else the one the replicas
    served during it."""
    from verl_vllm_rm.client.http import served_versions
    from verl_vllm_rm.scoring.options import DEFAULT_RM_NAME

    if url is None:
        version = metrics.get("rm/published_version", metrics.get(f"replicas/{DEFAULT_RM_NAME}/0/version"))
        return None if version is None else int(version)
    return max(served_versions([url] if isinstance(url, str) else url).values(), default=None)


def run_main_ppo(cfg: TinyPPOConfig, inputs: Inputs, server_url: str | list[str] | None,
                 on_step: Callable[[int, dict, int | None], None] | None = None,
                 overrides: list[str] | None = None) -> dict[int, int | None]:
    """Run main_ppo to the end; ``on_step(step, metrics, rm_version)`` as each step's metrics land.

    ``overrides`` replaces :func:`main_ppo_overrides` (a benchmark's variants). Returns the weight version
    served right after each step (:func:`served_version`; ``server_url`` None: the run's managed replicas).
    """
    for stale in ("metrics.jsonl", "generations.jsonl", "reward_calls.jsonl"):
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
                    versions[step] = served_version(server_url, metrics)
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
    if url is None and not cfg.replicas:
        try:
            server = start_server(inputs.rm, server_args(cfg), log_path=cfg.work_dir / "reward_server.log",
                                  env=cpu_run_env())
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

