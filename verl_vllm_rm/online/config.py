"""Options of online RM training: ``+online_rm.*`` in a verl run (see docs/weight_sync.md)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping

from verl_vllm_rm.options import build, check_ranges, inline
from verl_vllm_rm.parity.probe import ParityProbe
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES


#: ``param_dtype`` (verl's names) -> the torch dtype name the server and parity speak
TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
FLASH_ATTENTION = "flash_attention_2"

logger = logging.getLogger(__name__)


def flash_attn_imports() -> bool:
    """Whether the ``flash_attn`` package imports here (an install built for another torch or CUDA does not)."""
    try:
        import flash_attn  # noqa: F401
    except Exception:
        return False
    return True


def resolve_attention(option: str, flash_available: Callable[[], bool] = flash_attn_imports) -> str:
    """The attention the RM is built with: ``auto`` is ``flash_attention_2`` when flash-attn imports, else
    ``sdpa`` (logged); ``flash_attention_2`` without flash-attn is refused here rather than at the model's load
    on every rank. Decided in the trainer's process: the RM's ranks run in the same environment."""
    if option == "auto":
        chosen = FLASH_ATTENTION if flash_available() else "sdpa"
        logger.info("online_rm.attn_implementation=auto: the RM uses %s (%s)", chosen,
                    "flash_attn imports" if chosen == FLASH_ATTENTION else "flash_attn does not import")
        return chosen
    if option == FLASH_ATTENTION and not flash_available():
        raise ValueError("online_rm.attn_implementation=flash_attention_2 needs the flash_attn package, which does "
                         "not import in this environment: install it (pip install flash-attn --no-build-isolation, "
                         "see docs/quickstart.md), or set attn_implementation=auto (sdpa without it) or sdpa")
    return option


# The RM's engine settings where verl has a config dataclass for them: each section's fields are that dataclass's
# own (same names), handed to it as they are by OnlineRMConfig.training_worker_config (VERL_CONFIG names it;
# tests/unit/online/test_config.py checks every name against the installed verl).


@dataclass
class RMOptimizerOptions:
    """The RM's optimizer (AdamW, constant schedule): fields of verl's ``FSDPOptimizerConfig``."""

    VERL_CONFIG: ClassVar[str] = "verl.workers.config.FSDPOptimizerConfig"

    lr: float = 1e-5
    """verl's ``optim.lr`` (AdamW, constant schedule)."""
    weight_decay: float = 0.0
    """verl's ``optim.weight_decay``."""
    clip_grad: float = 1.0
    """verl's ``optim.clip_grad``: the gradient norm clip."""

    def __post_init__(self) -> None:
        check_ranges(self, {"> 0": ("lr", "clip_grad"), ">= 0": ("weight_decay",)})


@dataclass
class RMModelOptions:
    """How verl builds the RM's module: fields of verl's ``HFModelConfig``."""

    VERL_CONFIG: ClassVar[str] = "verl.workers.config.HFModelConfig"

    lora_rank: int = 8
    """verl's ``model.lora_rank`` (``training_mode=lora``)."""
    lora_alpha: int = 16
    """verl's ``model.lora_alpha`` (``training_mode=lora``)."""
    target_modules: Any = "all-linear"
    """verl's ``model.target_modules``: the modules LoRA adapts (``training_mode=lora``)."""
    enable_gradient_checkpointing: bool = True
    """verl's ``model.enable_gradient_checkpointing``."""
    use_remove_padding: bool | None = None
    """verl's ``model.use_remove_padding`` (its padding-free kernels); unset: on exactly when the RM's attention is
    ``flash_attention_2``."""

    def __post_init__(self) -> None:
        check_ranges(self, {">= 1": ("lora_rank", "lora_alpha")})


@dataclass
class RMEngineOptions:
    """FSDP's sharding and offload, and the micro-batches: fields of verl's ``FSDPEngineConfig``."""

    VERL_CONFIG: ClassVar[str] = "verl.workers.config.FSDPEngineConfig"

    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    """verl's ``engine.strategy``."""
    param_offload: bool = False
    """verl's parameter offload to CPU between steps."""
    optimizer_offload: bool = False
    """verl's optimizer-state offload to CPU between steps."""
    fsdp_size: int = -1
    """Ranks one copy is sharded over (-1: all of the RM's ranks)."""
    micro_batch_size_per_gpu: int = 4
    """Preference pairs per micro-batch; gradients accumulate over micro-batches."""
    use_dynamic_bsz: bool = False
    """Micro-batches by token count (``max_token_len_per_gpu``) instead; a pair is never split."""
    max_token_len_per_gpu: int = 16384
    """Most tokens per micro-batch with ``use_dynamic_bsz``."""

    def __post_init__(self) -> None:
        check_ranges(self, {">= 1": ("micro_batch_size_per_gpu", "max_token_len_per_gpu")})
        if self.fsdp_size != -1 and self.fsdp_size < 1:
            raise ValueError(f"fsdp_size must be -1 (all RM ranks) or >= 1, got {self.fsdp_size}")


@dataclass
class OnlineRMConfig:
    """Options of online RM training (``+online_rm.*`` in a verl run; see docs/weight_sync.md)."""

    model_path: str
    """The RM to train (a ``*ForSequenceClassification`` checkpoint)."""
    server_url: list[str] | None = None
    """The server, or the fixed list of servers, each publish goes to (several: a two-phase commit, one version
    serving); give this or ``reward_model``."""
    reward_model: str | None = None
    """The managed RM (``reward_kwargs.replicas``) whose every replica gets each publish; give this or
    ``server_url``."""
    on_server_failure: Literal["abort", "leave_behind"] | None = None
    """A ``server_url`` list's server that fails a publish (dies, hangs, its transfer breaks; a refusal always aborts):
    ``abort`` (unset: the default) keeps every server on the old version and fails the step; ``leave_behind``
    publishes to the others, and the failed one gets no request until the next publish re-syncs it
    (``rm/publish_left_behind``). Managed replicas always leave a failed one behind (not set with
    ``reward_model``)."""
    training_mode: str = "head_only"
    """What is trained and published: ``head_only``, ``lora`` or ``full``."""
    publish_every: int = 1
    """Publish after every N RM steps."""
    optim: RMOptimizerOptions = inline(RMOptimizerOptions)
    """The optimizer: ``lr``, ``weight_decay``, ``clip_grad`` (verl's ``FSDPOptimizerConfig``)."""
    model: RMModelOptions = inline(RMModelOptions)
    """The model's build: LoRA, gradient checkpointing, padding removal (verl's ``HFModelConfig``)."""
    attn_implementation: str = "auto"
    """verl's ``model.override_config.attn_implementation``: ``auto`` takes ``flash_attention_2`` when the
    ``flash_attn`` package imports, else ``sdpa`` (and logs which); or any transformers attention by name."""
    engine: RMEngineOptions = inline(RMEngineOptions)
    """FSDP and the micro-batches (verl's ``FSDPEngineConfig``)."""
    param_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    """``mixed_precision.param_dtype``: the compute dtype; master weights, gradient reduction and Adam's state are
    fp32."""
    placement: Literal["separate", "colocated"] = "separate"
    """``separate``: the RM's ranks on their own Ray resource pool of ``num_workers`` slots; ``colocated``: one RM
    rank in each slot of the actor's pool."""
    placement_timeout_s: float = 300.0
    """How long (seconds) the RM's own ranks may wait for Ray to free their resources."""
    min_reward_gap: float = 0.0
    """Smallest gap between a group's best and worst response on the pair source that makes a preference pair."""
    reward_key: list[str] = field(default_factory=lambda: ["verifiable_score"])
    """The pair source: what ranks a group's responses; a list is tried in order per group, the first with a gap
    decides (``rm_scores`` includes the RM's own score: it would learn from its own judgement)."""
    num_workers: int = 1
    """RM ranks with ``placement=separate``."""
    use_gpu: bool = True
    """The separate pool on GPUs (false on CPU)."""
    api_key: str | None = None
    """The reward server's API key, for the weight-sync client."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """Bytes of tensors per transfer bucket of a publish (the server's device memory for a receive)."""
    lora_wire: Literal["auto", "adapters", "merged"] = "auto"
    """``training_mode=lora``: ``auto`` sends the adapters when the server holds the base weights, else merged
    weights with a warning; ``adapters`` refuses to send merged weights; ``merged`` always sends them."""
    timeout_s: float = 300.0
    """The weight-sync client's timeout for a publish's transfer, in seconds (its HTTP calls: at most 60)."""
    parity_every: int = 0
    """Run the parity probe after every N publishes (0: never)."""
    parity_threshold: float = 1.05
    """The parity probe's bound on ``mean(exp|diff|)`` between the server's and the trainer's scores."""
    max_idle_steps: int = 10
    """PPO steps in a row without an RM step (no preference pair) before the run fails (0: never)."""
    max_staleness: int | None = None
    """Asynchronous trainer modes only: the RM versions one PPO batch may have been scored by; older finished
    prompt groups are evicted and replaced (unset: no bound)."""

    def __post_init__(self) -> None:
        if isinstance(self.server_url, str):  # one server, given directly (an option file's one URL is a list)
            self.server_url = [self.server_url]
        if (self.server_url is None) == (self.reward_model is None):
            raise ValueError("online_rm needs exactly one of server_url (the servers) and reward_model (the managed "
                             f"replicas of that RM), got server_url={self.server_url!r}, "
                             f"reward_model={self.reward_model!r}")
        if self.on_server_failure is not None and self.reward_model is not None:
            raise ValueError(f"online_rm.on_server_failure={self.on_server_failure!r} decides what a fixed server_url "
                             "list does with a server that fails a publish; the managed replicas of reward_model "
                             "always leave it behind (the fleet restarts it, the next publish re-syncs it): drop "
                             "on_server_failure")
        mode = RewardModelTrainingMode.parse(self.training_mode)
        if self.lora_wire != "auto" and mode is not RewardModelTrainingMode.LORA:
            raise ValueError(f"online_rm.lora_wire={self.lora_wire!r} decides what a LoRA publish sends, and "
                             f"training_mode is {mode.value}: drop lora_wire or train with training_mode=lora")
        check_ranges(self, {"> 0": ("timeout_s", "placement_timeout_s"),
                            ">= 1": ("publish_every", "num_workers", "bucket_bytes", "max_staleness"),
                            ">= 0": ("parity_every", "max_idle_steps", "min_reward_gap")})

    def parity_probe(self) -> ParityProbe | None:
        if not self.parity_every:
            return None
        return ParityProbe(every=self.parity_every, threshold=self.parity_threshold,
                           compute_dtype=TORCH_DTYPE_NAMES[self.param_dtype])

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> "OnlineRMConfig":
        """Validate the ``online_rm`` section (a mapping or DictConfig)."""
        return build(cls, options, "online_rm")

    def training_worker_config(self):
        """verl's ``TrainingWorkerConfig`` for the RM: the critic's, with :data:`~verl_vllm_rm.online.engine.MODEL_TYPE`
        (verl's value-head engine holding an RM) and these options under verl's own names."""
        from verl.trainer.config import CheckpointConfig
        from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig

        from verl_vllm_rm.online.engine import MODEL_TYPE

        lora = RewardModelTrainingMode.parse(self.training_mode) is RewardModelTrainingMode.LORA
        attention = resolve_attention(self.attn_implementation)
        model_options = asdict(self.model) if lora else {**asdict(self.model), "lora_rank": 0}  # 0: no LoRA
        if model_options["use_remove_padding"] is None:
            model_options["use_remove_padding"] = attention == FLASH_ATTENTION
        model = HFModelConfig(path=self.model_path, **model_options,
                              override_config={"attn_implementation": attention})
        engine = FSDPEngineConfig(**asdict(self.engine), model_dtype="fp32", use_torch_compile=False,
                                  mixed_precision={"param_dtype": self.param_dtype})
        return TrainingWorkerConfig(model_type=MODEL_TYPE, model_config=model, engine_config=engine,
                                    optimizer_config=FSDPOptimizerConfig(**asdict(self.optim)),
                                    checkpoint_config=CheckpointConfig())
