"""The CPU profile: Hydra overrides that make any GRPO ``main_ppo`` run a tiny one verl runs on CPU.

``python -m verl_vllm_rm.dev.cpu_profile [STEPS [OVERRIDE ...]]`` prints them, one per line, for a run
with those overrides (``recipes/common.sh`` appends them under ``VERL_VLLM_RM_CPU_PROFILE=1``); ``verl-vllm-rm tiny-ppo`` and ``make demo`` use
:func:`cpu_profile` directly. Settings only: the patches are in :mod:`verl_vllm_rm.dev.cpu_harness.patches`.
"""

from __future__ import annotations

import os
import sys

from verl_vllm_rm.dev.cpu_names import BACKEND_NAME

#: Hydra overrides verl 0.9.1 needs on CPU (settings, not patches; the patches are in cpu_harness.patches).
CPU_OVERRIDES = [
    f"actor_rollout_ref.rollout.name={BACKEND_NAME}",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # one rollout process per replica
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    # With num_cpus=2 the run hung (verl's actors reserve CPUs); logical CPUs, not cores.
    "ray_kwargs.ray_init.num_cpus=16",
    # Ray's dashboard is ten more processes (nine head modules and an agent) starting beside the trainer's own on
    # 2 cores; verl 0.9.1 reads no state API in a run (its one use, ``_is_worker_alive``, is never called).
    "+ray_kwargs.ray_init.include_dashboard=False",
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

#: verl's v1 trainer modes (``trainer.v1.trainer_mode`` is ours: ``vllm_rm`` + ``_<mode>`` but for sync)
BASE_MODES = ("sync", "colocate_async", "separate_async")

#: separate_async on CPU: one standalone rollout replica beside the trainer's hybrid one (verl's default; verl
#: 0.9.1's ``hybrid_engine=False`` path raises in ``_setup``: it passes ``flush=True`` to ``logger.info``), synced
#: every mini-batch (train_batch_size = parameter_sync_step * ppo_mini_batch_size, which verl asserts) over the
#: harness's ``cpu_gloo`` checkpoint engine (verl refuses ``naive`` there and its other engines need a GPU library).
SEPARATE_ASYNC_OVERRIDES = [
    "trainer.v1.separate_async.parameter_sync_step=1",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_gloo",
]

#: The online RM trainer's engine on CPU: no accelerator slot, no flash attention (sdpa, padded batches), and
#: fp32 compute, as the CPU test servers serve fp32 (a bf16 server is tested on its own).
CPU_RM_ENGINE = {"use_gpu": False, "use_remove_padding": False, "attn_implementation": "sdpa", "param_dtype": "fp32"}


def cpu_profile(steps: int, batch_prompts: int = 4, group_size: int = 4, online: bool = False,
                external_modules: str | None = None, mode: str = "sync") -> list[str]:
    """Overrides that turn any GRPO run into a tiny one verl runs on CPU (appended last, they win).

    ``make test`` runs every script in ``recipes/`` with these (``VERL_VLLM_RM_CPU_PROFILE=1``; one that another
    execs, inside that one's run).
    ``external_modules`` (the harness first) also goes into Ray's runtime env, for recipes that set it
    there for workers on other nodes. ``mode``: verl's trainer mode the run uses (one of :data:`BASE_MODES`).
    """
    if mode not in BASE_MODES:
        raise ValueError(f"the trainer mode must be one of {BASE_MODES}, got {mode!r}")
    separate = mode == "separate_async"
    profile = [
        *CPU_OVERRIDES,
        # verl's pools reserve one accelerator per worker: one logical Ray GPU is a worker slot (separate_async's
        # standalone rollout replica takes a second one).
        f"+ray_kwargs.ray_init.num_gpus={2 if separate else 1}",
        *(SEPARATE_ASYNC_OVERRIDES if separate else []),
        f"data.train_batch_size={batch_prompts}",
        "data.max_prompt_length=48",
        "data.max_response_length=32",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_prompts}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        f"actor_rollout_ref.rollout.n={group_size}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        # verl starts 8 agent-loop and 8 reward-loop Ray workers by default (~0.5 GB and a verl import of ~10 s
        # of CPU each): one of each scores and generates a tiny batch (a run can ask for more after these).
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console,file]",
    ]
    if online:
        profile += [f"+online_rm.{key}={value}" for key, value in CPU_RM_ENGINE.items()]
    if external_modules:
        profile.append(f"++ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='{external_modules}'")
    return profile


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].isdigit():
        sys.exit("usage: python -m verl_vllm_rm.dev.cpu_profile [STEPS [OVERRIDE ...]]  "
                 "(the run itself: verl-vllm-rm tiny-ppo)")
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    if steps < 1:
        sys.exit(f"STEPS must be at least 1, got {steps} (VERL_VLLM_RM_CPU_STEPS in the recipes): a run of no step "
                 "trains nothing")
    online = any(arg.startswith("trainer.v1.trainer_mode=vllm_rm_online") for arg in sys.argv[2:])
    modules = os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    print("\n".join(cpu_profile(steps, online=online, external_modules=modules or None)))
