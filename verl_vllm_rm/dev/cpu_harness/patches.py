"""Every change the CPU harness makes to verl 0.9.1, in one list, each with the verl code it works around.

Each :class:`Patch` says what it changes, why, and how to tell that the installed
verl still needs it (``needed``): ``tests/integration/dev/test_cpu_harness.py`` fails loudly
when a patch no longer applies, naming it, so a verl upgrade never runs on a
silently stale harness. Nothing here runs unless the harness is imported
(``VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.dev.cpu_harness.activate``), and the harness
refuses to load where a GPU is visible.

Run settings that are plain Hydra overrides (not patches) live with the command
that sets them: :data:`verl_vllm_rm.dev.cpu_profile.CPU_OVERRIDES`.
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from typing import Callable

import torch.distributed


@dataclass(frozen=True)
class Patch:
    name: str
    verl_code: str  # where in verl the problem is
    why: str
    needed: Callable[[], bool]  # True while the installed verl still has the problem
    apply: Callable[[], None]


def _register_platform() -> None:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from verl_vllm_rm.dev.cpu_harness.platform import PLATFORM_NAME, PlatformCPU

    PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    os.environ["VERL_PLATFORM"] = PLATFORM_NAME  # inherited by every Ray worker


def _platform_needed() -> bool:
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from verl_vllm_rm.dev.cpu_harness.platform import PlatformCPU

    registered = PlatformRegistry.get("cpu")
    return registered is None or registered is PlatformCPU


def _dedupe_backends(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``; anything else unchanged."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    return ",".join(dict.fromkeys(part.strip() for part in backend.split(",")))


def _patch_backend_string() -> None:
    original = torch.distributed.init_process_group
    if getattr(original, "_vrm_dedupe", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _dedupe_backends(kwargs["backend"])
        elif args:
            args = (_dedupe_backends(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._vrm_dedupe = True
    torch.distributed.init_process_group = init_process_group


def _backend_string_needed() -> bool:
    from verl.utils import distributed

    return 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in inspect.getsource(
        distributed.initialize_global_process_group_ray)


def _select_fsdp_engine() -> None:
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # verl's own override of the engine lookup's device


def _fsdp_engine_needed() -> bool:
    import verl.workers.engine.fsdp.transformer_impl  # noqa: F401  (registers the FSDP engines)
    from verl.workers.engine.base import EngineRegistry

    fsdp2 = EngineRegistry._engines["language_model"]["fsdp2"]
    return "cuda" in fsdp2 and "cpu" not in fsdp2


def _register_rollout() -> None:
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_vllm_rm.dev.cpu_names import BACKEND_NAME

    def load():
        from verl_vllm_rm.dev.cpu_harness.rollout import CPURolloutReplica

        return CPURolloutReplica

    RolloutReplicaRegistry.register(BACKEND_NAME, load)
    base._ROLLOUT_REGISTRY[(BACKEND_NAME, "async")] = "verl_vllm_rm.dev.cpu_harness.rollout.CPUServerAdapter"


def _rollout_needed() -> bool:
    from verl_vllm_rm.dev.cpu_names import BACKEND_NAME
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    # Still the two registries this patch writes to, and verl ships no CPU backend of its own.
    return (isinstance(base._ROLLOUT_REGISTRY, dict) and ("vllm", "async") in base._ROLLOUT_REGISTRY
            and set(RolloutReplicaRegistry._registry) - {BACKEND_NAME} == {"vllm", "sglang", "trtllm"})


def _unpin_ref_offload() -> None:
    import dataclasses

    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    if getattr(policy, "_vrm_unpinned", False):
        return

    @dataclasses.dataclass
    class UnpinnedCPUOffloadPolicy(policy):
        """FSDP2's CPU offload without pinned host memory (pinning needs an accelerator)."""

        _vrm_unpinned = True

        def __post_init__(self) -> None:
            self.pin_memory = False

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def _unpin_needed() -> bool:
    from verl.workers.engine.fsdp import transformer_impl

    return "CPUOffloadPolicy(pin_memory=True)" in inspect.getsource(transformer_impl.FSDPEngine._build_fsdp_module)


def _register_checkpoint_engine() -> None:
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    from verl_vllm_rm.dev.cpu_harness.checkpoint_engine import BACKEND, CPUGlooCheckpointEngine

    CheckpointEngineRegistry.register(BACKEND)(CPUGlooCheckpointEngine)


def _log_reward_calls() -> None:
    from verl_vllm_rm.dev.cpu_harness.reward_call_log import log_reward_calls

    log_reward_calls()


def _reward_calls_loggable() -> bool:
    from verl_vllm_rm.dev.cpu_harness.reward_call_log import reward_calls_loggable

    return reward_calls_loggable()


def _log_rm_steps() -> None:
    from verl_vllm_rm.dev.cpu_harness.rm_step_log import log_rm_steps

    log_rm_steps()


def _gate_rm_steps() -> None:
    from verl_vllm_rm.dev.cpu_harness.rm_step_gate import hold_first_rm_step_for_a_finished_group

    hold_first_rm_step_for_a_finished_group()


def _checkpoint_engine_needed() -> bool:
    import verl.checkpoint_engine  # noqa: F401  (registers every engine whose transport imports)
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from verl.trainer.ppo.v1 import trainer_separate_async

    from verl_vllm_rm.dev.cpu_harness.checkpoint_engine import BACKEND

    # separate_async still refuses the naive engine, and nothing but naive (and ours) registers without a GPU library
    refuses_naive = 'checkpoint_engine.backend != "naive"' in inspect.getsource(trainer_separate_async)
    return refuses_naive and set(CheckpointEngineRegistry._registry) - {BACKEND} == {"naive"}


def _port_window_for_worker_groups() -> None:
    from verl.single_controller.ray.base import RayWorkerGroup

    original = RayWorkerGroup.__init__
    if getattr(original, "_vrm_port_window", False):
        return

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        if kwargs.get("master_port_range") is None:
            # imported here: the harness applies while verl is being imported, before our online modules can load
            from verl_vllm_rm.online.driver import master_port_range

            kwargs["master_port_range"] = master_port_range()
        original(self, *args, **kwargs)

    init._vrm_port_window = True
    RayWorkerGroup.__init__ = init


def _port_window_needed() -> bool:
    from verl.single_controller.ray.base import get_master_addr_port

    source = inspect.getsource(get_master_addr_port._function)  # a ray.remote function: its Python function
    return 's.bind(("", 0))' in source


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="cpu-platform",
        verl_code="verl/plugin/platform/platform_manager.py: _detect_platform_name; verl/utils/device.py: "
                  "auto_set_device",
        why="no cpu platform is registered: detection falls back to 'nvidia' and trainer.device=cpu is overwritten",
        needed=_platform_needed,
        apply=_register_platform,
    ),
    Patch(
        name="gloo-backend-string",
        verl_code="verl/utils/distributed.py: initialize_global_process_group_ray",
        why="builds 'cpu:gloo,{device}:{backend}', which on the cpu platform is 'cpu:gloo,cpu:gloo' and "
            "torch.distributed raises 'Duplicate device type cpu'; repeated entries are dropped",
        needed=_backend_string_needed,
        apply=_patch_backend_string,
    ),
    Patch(
        name="fsdp-engine-device",
        verl_code="verl/workers/engine/fsdp/transformer_impl.py: @EngineRegistry.register(device=['cuda', 'npu'])",
        why="the FSDP engines are registered for cuda and npu only; VERL_ENGINE_DEVICE=cuda selects the same "
            "class, which then places tensors through the cpu platform",
        needed=_fsdp_engine_needed,
        apply=_select_fsdp_engine,
    ),
    Patch(
        name="hf-cpu-rollout",
        verl_code="verl/workers/rollout/replica.py: RolloutReplicaRegistry; verl/workers/rollout/base.py: "
                  "_ROLLOUT_REGISTRY",
        why="main_ppo can only roll out with vllm, sglang or trtllm, each needing its engine next to verl; "
            "'hf_cpu' (a transformers copy of the policy) is added to both registries",
        needed=_rollout_needed,
        apply=_register_rollout,
    ),
    Patch(
        name="unpinned-ref-offload",
        verl_code="verl/workers/engine/fsdp/transformer_impl.py: FSDPEngine._build_fsdp_module",
        why="a forward-only FSDP2 model (the reference policy of use_kl_loss=True) always gets "
            "CPUOffloadPolicy(pin_memory=True), and pinning host memory raises 'Cannot access accelerator "
            "device when none is available'; the policy is made without pinning",
        needed=_unpin_needed,
        apply=_unpin_ref_offload,
    ),
    Patch(
        name="cpu-gloo-checkpoint-engine",
        verl_code="verl/trainer/ppo/v1/trainer_separate_async.py: __init__ refuses checkpoint_engine.backend "
                  "'naive'; verl/checkpoint_engine/__init__.py: nccl, nixl, delta_sharded need cupy, hccl vllm, "
                  "kimi and mooncake their own libraries",
        why="separate_async syncs its standalone rollout replicas through a checkpoint engine other than naive, "
            "and none of verl's runs without a GPU library; 'cpu_gloo' (checkpoint_engine.py: verl's NCCL engine's "
            "bucketed broadcast over a gloo group) is registered",
        needed=_checkpoint_engine_needed,
        apply=_register_checkpoint_engine,
    ),
    Patch(
        name="worker-group-port-window",
        verl_code="verl/single_controller/ray/base.py: get_master_addr_port (master_port_range None: bind(0), "
                  "close, and rank 0's init_process_group binds the port again later); verl's trainer never passes "
                  "a master_port_range",
        why="between the close and the bind, an outgoing connection on the node may be given the same port as its "
            "source: main_ppo's workers then fail with EADDRINUSE (seen in a fresh clone's make test, the actor's "
            "store of the any_rm run, while the other xdist worker's tests made connections); every worker group "
            "gets a random 1000-port window below the ephemeral range instead (online/driver.master_port_range)",
        needed=_port_window_needed,
        apply=_port_window_for_worker_groups,
    ),
    Patch(
        name="reward-call-log",
        verl_code="verl/experimental/reward_loop/reward_loop.py: RewardLoopWorker.compute_score",
        why="a probe, not a workaround: with VERL_VLLM_RM_REWARD_CALL_LOG set, each reward call's trajectory is "
            "appended to that file (reward_call_log.py), so the tests prove a trajectory resumed after an abort "
            "(partial rollouts of the asynchronous trainers) is scored once, whole",
        needed=_reward_calls_loggable,
        apply=_log_reward_calls,
    ),
    Patch(
        name="rm-step-log",
        verl_code="none: wraps this package's OnlineRewardModelTraining.train_reward_model "
                  "(verl_vllm_rm/plugin/online_mode.py), run in verl's trainer process",
        why="a probe, not a workaround: with VERL_VLLM_RM_RM_STEP_LOG set, each online RM step's wall-clock window "
            "is appended to that file (rm_step_log.py), so the tests show generation going on while the RM "
            "trains and publishes in verl's asynchronous trainers",
        needed=lambda: True,
        apply=_log_rm_steps,
    ),
    Patch(
        name="rm-step-gate",
        verl_code="none: wraps this package's RMStepAfterStepEnd._run_rm_step (verl_vllm_rm/plugin/online_mode.py), "
                  "run in verl's trainer process",
        why="a test's gate, not a workaround: with VERL_VLLM_RM_RM_STEP_AFTER_A_FINISHED_GROUP set, the first RM "
            "step of an asynchronous trainer waits until a group of the next step's prompts has finished "
            "(rm_step_gate.py), so a test of online_rm.max_staleness always has a group to evict",
        needed=lambda: True,
        apply=_gate_rm_steps,
    ),
)


def apply_all() -> None:
    for patch in PATCHES:
        patch.apply()
