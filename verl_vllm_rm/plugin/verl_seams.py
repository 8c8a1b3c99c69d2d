"""Every private or internal verl member this package stands on, listed once, and the start-up check of them.

verl has no public interface for what the trainer modes, the online RM trainer and the reward manager do: they
override the v1 trainer's and the replay buffer's underscored methods, read attributes verl's classes set on
themselves, and build on verl's value-head engine and training worker. A verl release may rename or reshape any
of them without notice, and the breakage would surface mid-run, far from its cause. So each member is an entry of
:data:`SEAMS`: verl's class (and so its file in verl 0.9.1), the member, what it must still take or contain, and
which of this package's modules use it. :func:`check_verl_seams` checks them all when the trainer modes register
(:mod:`verl_vllm_rm.plugin.trainer_registry`): a missing or changed member stops the run at start-up with a
:class:`VerlSeamError` naming the installed verl, the member and the verl this package was tested with.

The check only reads what is already imported: by the time verl's trainer registry is imported, every module
below is too (a module that is not is imported, and its absence reported as the members it should hold). It reads
signatures and code objects, never source files: a few milliseconds.

The CPU harness's changes to verl (opt-in, for tests) are listed and checked in
:mod:`verl_vllm_rm.dev.cpu_harness.patches`, not here.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from types import CodeType
from typing import Any, Iterator, Union

#: the verl release every seam below was read from and tested against
TESTED_VERL = "0.9.1"
#: the module older setups named in VERL_USE_EXTERNAL_MODULES (kept so that ``import verl`` still finds it)
OLD_TRAINER_MODE_MODULE = "verl_vllm_rm.online.trainer_mode"
OLD_MODULE_MESSAGE = (f"verl-vllm-rm: VERL_USE_EXTERNAL_MODULES={OLD_TRAINER_MODE_MODULE} is no longer needed: the "
                      "package's verl.plugins entry point registers trainer mode vllm_rm_online; drop it from the "
                      "environment (and from ray_kwargs.ray_init.runtime_env.env_vars)")

logger = logging.getLogger("verl_vllm_rm")


class VerlSeamError(RuntimeError):
    """The installed verl lacks, or changed, a member this package stands on."""


@dataclass(frozen=True)
class Takes:
    """A method whose parameters (after ``self``) include ``params`` in this order, any others with a default."""

    params: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"take ({', '.join(self.params)})"


@dataclass(frozen=True)
class SetIn:
    """An attribute verl assigns (``self.<member> = ...``) in each of the owner's ``functions``."""

    functions: tuple[str, ...]

    def __str__(self) -> str:
        return f"be set in {' and '.join(self.functions)}"


@dataclass(frozen=True)
class Uses:
    """The code of ``function`` (the member itself when None) still uses ``names`` (attributes, then string keys),
    first in this order: the calls and keys our override relies on."""

    names: tuple[str, ...]
    function: str | None = None

    def __str__(self) -> str:
        where = f" in {self.function}" if self.function else ""
        return f"use {', then '.join(self.names)}{where}"


@dataclass(frozen=True)
class Exists:
    """A class attribute (an enum member, a method we call as is)."""

    def __str__(self) -> str:
        return "exist"


Requirement = Union[Takes, SetIn, Uses, Exists]


@dataclass(frozen=True)
class Seam:
    """One verl member this package stands on."""

    module: str  # verl's module holding ``owner``
    owner: str  # the verl class
    member: str
    must: tuple[Requirement, ...]
    used_by: tuple[str, ...]  # this package's modules that use the member (paths under verl_vllm_rm/)

    @property
    def verl_file(self) -> str:
        """The owner's file, as in verl's repository (``verl/...py``)."""
        return self.module.replace(".", "/") + ".py"

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.member}"


# verl's modules
TRAINER = "verl.trainer.ppo.v1.trainer_base"
BUFFER = "verl.trainer.ppo.v1.replay_buffer"
ENGINE = "verl.workers.engine.fsdp.transformer_impl"
RAY = "verl.single_controller.ray.base"
# ours
METRICS_MODES = "plugin/trainer_modes.py"
ONLINE_MODE = "plugin/online_mode.py"
STALENESS = "plugin/rm_staleness.py"
TOKEN_PLACEMENT = "plugin/token_placement.py"
RM_ENGINE = "online/engine.py"
RM_WORKER = "online/worker.py"
RM_DRIVER = "online/driver.py"


def _trainer(member: str, *must: Requirement, used_by: tuple[str, ...]) -> Seam:
    return Seam(TRAINER, "PPOTrainer", member, must, used_by)


def _buffer(member: str, *must: Requirement) -> Seam:
    return Seam(BUFFER, "ReplayBufferAsync", member, must, (STALENESS,))


def _engine(member: str, *must: Requirement, used_by: tuple[str, ...] = (RM_ENGINE,)) -> Seam:
    return Seam(ENGINE, "FSDPEngineWithValueHead", member, must, used_by)


SEAMS: tuple[Seam, ...] = (
    # verl's v1 trainer (every trainer mode is one of its subclasses)
    _trainer("trainer_mode", SetIn(("__init__",)), used_by=(METRICS_MODES, ONLINE_MODE)),
    _trainer("replay_buffer", SetIn(("__init__",)), used_by=(ONLINE_MODE,)),
    _trainer("_pending_sync_metrics", SetIn(("_consume_sync_metrics",)), used_by=(ONLINE_MODE,)),
    _trainer("global_steps", SetIn(("_load_checkpoint", "fit")), used_by=(METRICS_MODES, ONLINE_MODE)),
    _trainer("total_training_steps", SetIn(("_init_dataloader",)), used_by=(ONLINE_MODE,)),
    _trainer("timing_raw", SetIn(("fit",)), used_by=(ONLINE_MODE,)),
    _trainer("role_worker_mapping", SetIn(("_init_resource_pool_mgr",)), used_by=(ONLINE_MODE,)),
    _trainer("resource_pool_manager", SetIn(("_init_resource_pool_mgr",)), used_by=(ONLINE_MODE,)),
    _trainer("init", Takes(), used_by=(METRICS_MODES, ONLINE_MODE)),
    _trainer("step", Takes(("metrics", "timing_raw")), used_by=(METRICS_MODES, ONLINE_MODE)),
    # the online RM step after on_step_end relies on this order: checkpoint, on_step_end, its metrics merged
    _trainer("fit", Takes(("agent_loop_manager",)),
             Uses(("step", "_save_checkpoint", "on_step_end", "_consume_sync_metrics", "_log_rollout_data")),
             used_by=(METRICS_MODES,)),
    _trainer("on_step_end", Takes(), used_by=(ONLINE_MODE,)),
    # step_reward=token: every training batch's advantage is computed from rm_scores, which the trainer modes
    # rewrite first; the agent loop places the manager's scalar at the last token of each output's rm_scores
    _trainer("_step_once", Takes(("metrics", "timing_raw", "sample_batch_size")), Uses(("_compute_advantage",)),
             used_by=(METRICS_MODES,)),
    _trainer("_compute_advantage", Takes(("batch", "metrics")), Uses(("rm_scores",)), used_by=(METRICS_MODES,)),
    Seam("verl.experimental.agent_loop.agent_loop", "AgentLoopOutput", "as_dict", (Uses(("reward_score",
                                                                                         "rm_scores")),),
         (TOKEN_PLACEMENT,)),
    # validation generates through the agent-loop manager fit was given (ValidationTagging wraps it)
    _trainer("_validate", Takes(), Uses(("agent_loop_manager", "generate_sequences")), used_by=(METRICS_MODES,)),
    _trainer("get_reward_handles", Takes(), used_by=(METRICS_MODES,)),
    _trainer("_build_replay_buffer", Takes(), Uses(("_add_prompts_to_generate", "_resolve_filter_groups_metric")),
             used_by=(ONLINE_MODE,)),
    _trainer("_add_prompts_to_generate", Takes(("num_prompts",)), used_by=(ONLINE_MODE,)),
    _trainer("_resolve_filter_groups_metric", Takes(), used_by=(ONLINE_MODE,)),
    _trainer("_add_batch_to_generate", Takes(), used_by=(ONLINE_MODE,)),
    _trainer("_save_checkpoint", Takes(), used_by=(METRICS_MODES, ONLINE_MODE)),
    # the rollout dump: our columns are matched to its rows by the trajectory keys it passes as "uid"
    _trainer("_log_rollout_data", Takes(("batch", "timing_raw", "rollout_data_dir")),
             Uses(("_dump_generations", "uid")), used_by=(METRICS_MODES,)),
    _trainer("_dump_generations", Takes(("inputs", "outputs", "gts", "scores", "reward_extra_infos_dict",
                                         "dump_path")), used_by=(METRICS_MODES,)),
    Seam("verl.trainer.ppo.utils", "Role", "Actor", (Exists(),), (ONLINE_MODE,)),
    Seam("verl.trainer.ppo.utils", "Role", "ActorRolloutRef", (Exists(),), (ONLINE_MODE,)),
    Seam("verl.trainer.ppo.utils", "Role", "ActorRollout", (Exists(),), (ONLINE_MODE,)),
    # verl's asynchronous replay buffer (online_rm.max_staleness adds an eviction reason)
    _buffer("__init__", Takes(("trainer_mode", "trainer_config", "max_off_policy_threshold", "max_off_policy_strategy",
                               "sampler_kwargs", "refill_fn", "filter_groups_metric", "sync_refill_failed_groups"))),
    _buffer("_sync_metadata_from_transfer_queue", Takes()),
    _buffer("finished_keys", SetIn(("__init__",))),
    _buffer("partitions", SetIn(("__init__",))),
    _buffer("_terminal_eviction_reasons", Takes(("global_steps", "partition_id"))),
    _buffer("_sampleable_terminal_keys", Takes(("partition_id", "eviction_reasons"))),
    _buffer("_evict_terminal_groups", Takes(("global_steps", "partition_id", "eviction_reasons"))),
    _buffer("_metrics_prefix", Takes(("partition_id",))),
    _buffer("_clear_groups", Takes(("partition_id", "uids"))),
    # the reward loop: a worker's manager, and the event loop a manager runs on
    Seam("verl.experimental.reward_loop.reward_loop", "RewardLoopWorker", "reward_manager",
         (SetIn(("_init_reward_fn",)),), ("plugin/reward_workers.py",)),
    Seam("verl.experimental.reward_loop.reward_manager.base", "RewardManagerBase", "loop", (SetIn(("__init__",)),),
         ("scoring/manager.py",)),
    Seam("verl.experimental.reward_loop.reward_manager.base", "RewardManagerBase", "tokenizer",
         (SetIn(("__init__",)),), ("scoring/manager.py",)),
    # verl's critic engine, holding the online RM
    _engine("_build_model_optimizer", Takes(), Uses(("_build_module", "_build_lora_module"))),
    _engine("_build_module", Takes()),
    _engine("_build_lora_module", Takes(("module",))),
    _engine("model_config", SetIn(("__init__",))),
    _engine("engine_config", SetIn(("__init__",))),
    _engine("device_mesh", SetIn(("_init_device_mesh",))),
    _engine("ulysses_sequence_parallel_size", SetIn(("_init_device_mesh",))),
    _engine("use_remove_padding", SetIn(("__init__",))),
    _engine("module", SetIn(("_build_model_optimizer",)), used_by=(RM_WORKER,)),
    _engine("optimizer", SetIn(("_build_model_optimizer",)), used_by=(RM_WORKER,)),
    # verl's training worker, one RM rank: we set its loss, train_batch reads it
    Seam("verl.workers.engine_workers", "TrainingWorker", "__init__", (Takes(("config",)),), (RM_WORKER,)),
    Seam("verl.workers.engine_workers", "TrainingWorker", "engine", (SetIn(("__init__",)),), (RM_WORKER,)),
    Seam("verl.workers.engine_workers", "TrainingWorker", "loss_fn",
         (SetIn(("__init__",)), Uses(("loss_fn",), "train_batch")), (RM_WORKER,)),
    # the RM ranks' own placement group, and the port window of their torch.distributed store
    Seam(RAY, "RayResourcePool", "pgs", (SetIn(("__init__",)), Uses(("pgs",), "get_placement_groups")), (RM_DRIVER,)),
    Seam(RAY, "RayWorkerGroup", "__init__",
         (Takes(("resource_pool", "ray_cls_with_init", "name_prefix")), Uses(("master_port_range",))), (RM_DRIVER,)),
)


def _installed_verl() -> str:
    verl = sys.modules.get("verl")
    return getattr(verl, "__version__", "unknown")


def _owner(seam: Seam) -> Any:
    """The verl class (None when its module or the class is gone). Its module is imported already on verl 0.9.1
    (by verl's trainer registry); a verl that moved it gets it imported here, or reported gone."""
    try:
        module = sys.modules.get(seam.module) or importlib.import_module(seam.module)
    except ImportError:
        return None
    return getattr(module, seam.owner, None)


def _function(owner: Any, name: str) -> Any:
    """The plain function behind ``owner.name`` (decorators that keep ``__wrapped__`` unwrapped); None if none."""
    member = inspect.getattr_static(owner, name, None)
    member = getattr(member, "__func__", member)  # staticmethod, classmethod
    member = inspect.unwrap(member) if callable(member) else member
    return member if hasattr(member, "__code__") else None


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


STORE_ATTR, EXTENDED_ARG = dis.opmap["STORE_ATTR"], dis.opmap["EXTENDED_ARG"]


def _names_used(function: Any) -> list[str]:
    """The attribute and global names ``function``'s code uses (nested functions included), in order of first use
    (the compiler numbers them so), then its string constants."""
    codes = list(_codes(function.__code__))
    return list(dict.fromkeys([*(name for code in codes for name in code.co_names),
                               *(const for code in codes for const in code.co_consts if isinstance(const, str))]))


def _stored_attributes(code: CodeType) -> set[str]:
    """The attributes ``code`` assigns (``x.<name> = ...``), read from its raw bytecode: ``dis`` would cost ten
    times as much, and STORE_ATTR's argument is an index into ``co_names`` in every CPython since 3.6."""
    stored, extended, raw = set(), 0, code.co_code
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | extended
        extended = arg << 8 if op == EXTENDED_ARG else 0
        if op == STORE_ATTR:
            stored.add(code.co_names[arg])
    return stored


def _assigned(function: Any, attribute: str) -> bool:
    return any(attribute in _stored_attributes(code) for code in _codes(function.__code__))


def _parameters_problem(function: Any, params: tuple[str, ...]) -> str | None:
    signature = inspect.signature(function)
    given = [p for p in signature.parameters.values() if p.name not in ("self", "cls")]
    names = [p.name for p in given]
    listed = [name for name in names if name in params]
    extra = [p.name for p in given if p.name not in params and p.default is p.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if listed != list(params) or extra:
        return f"it takes ({', '.join(names)})"
    return None


GONE = "gone"  # the member itself is missing: its other requirements go unsaid


def _problem(seam: Seam, owner: Any, requirement: Requirement) -> str | None:
    """What is wrong with one requirement of a seam (None: it holds)."""
    if isinstance(requirement, SetIn):
        for name in requirement.functions:
            function = _function(owner, name)
            if function is None:
                return f"{seam.owner}.{name}, where it was set, is gone"
            if not _assigned(function, seam.member):
                return f"{seam.owner}.{name} no longer sets it"
        return None
    if isinstance(requirement, Exists):
        return None if hasattr(owner, seam.member) else GONE
    where = requirement.function if isinstance(requirement, Uses) else None
    function = _function(owner, where or seam.member)
    if function is None:
        return GONE if where is None else f"{seam.owner}.{where} is gone"
    if isinstance(requirement, Takes):
        return _parameters_problem(function, requirement.params)
    used = _names_used(function)
    missing = [name for name in requirement.names if name not in used]
    if missing:
        return f"its code no longer uses {', '.join(missing)}"
    order = [name for name in used if name in requirement.names]
    return None if order == list(requirement.names) else f"its code now uses them in the order {', '.join(order)}"


def _what_changed(seam: Seam) -> list[str]:
    """What is wrong with ``seam`` in the installed verl, one phrase a requirement (none: it holds)."""
    owner = _owner(seam)
    if owner is None:
        return [f"is gone: verl has no class {seam.owner} in {seam.module}"]
    phrases = []
    for requirement in seam.must:
        why = _problem(seam, owner, requirement)
        if why is GONE:
            return ["is gone"]
        if why is not None:
            phrases.append(f"must {requirement}: {why}")
    return phrases


def seam_problems(seams: tuple[Seam, ...] = SEAMS) -> list[str]:
    """One line per missing member or broken requirement of ``seams`` in the installed verl, naming the member, its
    verl file and this package's modules that use it."""
    return [f"{seam.name} ({seam.verl_file}) {phrase} [used by verl_vllm_rm/{', verl_vllm_rm/'.join(seam.used_by)}]"
            for seam in seams for phrase in _what_changed(seam)]


def check_verl_seams(seams: tuple[Seam, ...] = SEAMS) -> None:
    """Stop the run at start-up when the installed verl lacks or changed a member of :data:`SEAMS`."""
    problems = seam_problems(seams)
    if problems:
        raise VerlSeamError(
            f"verl-vllm-rm stands on verl members that the installed verl {_installed_verl()} lacks or changed "
            f"(this package was tested with verl {TESTED_VERL}):\n  " + "\n  ".join(problems) + "\n"
            f"Install the verl it was tested with (pip install verl=={TESTED_VERL}), or a verl-vllm-rm release made "
            f"for verl {_installed_verl()}; the members are listed in verl_vllm_rm/plugin/verl_seams.py")


def warn_old_trainer_mode_module() -> bool:
    """Say once that ``VERL_USE_EXTERNAL_MODULES`` still names :data:`OLD_TRAINER_MODE_MODULE`, which is no longer
    needed (verl imports the modules it names at ``import verl`` and fails if one is gone, so the module stays, empty,
    and the warning is given here)."""
    named = OLD_TRAINER_MODE_MODULE in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").replace(" ", "").split(",")
    if named:
        logger.warning(OLD_MODULE_MESSAGE)
        warnings.warn(OLD_MODULE_MESSAGE, DeprecationWarning, stacklevel=2)
    return named
