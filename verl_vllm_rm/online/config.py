"""Options of online RM training: ``+online_rm.*`` in a verl run (see docs/weight_sync.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from verl_vllm_rm.options import build, check_ranges
from verl_vllm_rm.parity.probe import ParityProbe
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES


#: ``param_dtype`` (verl's names) -> the torch dtype name the server and parity speak
TORCH_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass
class OnlineRMConfig:
    """Options of online RM training (``+online_rm.*`` in a verl run; see docs/weight_sync.md)."""

    model_path: str
    server_url: str | None = None  # the one server to publish to, or:
    reward_model: str | None = None  # the managed RM (reward_kwargs.replicas) whose every replica gets each publish
    training_mode: str = "head_only"
    publish_every: int = 1
    # The optimizer: verl's optim.* names
    lr: float = 1e-5
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    # The model: verl's model.* names (LoRA options apply in training_mode=lora)
    lora_rank: int = 8
    lora_alpha: int = 16
    target_modules: Any = "all-linear"
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = True  # needs flash attention (GPU); False on CPU
    attn_implementation: str = "flash_attention_2"  # override_config.attn_implementation; sdpa on CPU
    # The engine: verl's engine.* / fsdp_config names
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    param_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"  # mixed_precision.param_dtype: compute; masters are fp32
    param_offload: bool = False
    optimizer_offload: bool = False
    fsdp_size: int = -1  # ranks one copy is sharded over (-1: all of the RM's ranks)
    micro_batch_size_per_gpu: int = 4  # preference pairs per micro-batch (gradients accumulate over them)
    use_dynamic_bsz: bool = False  # micro-batches by token count instead (max_token_len_per_gpu); pairs stay whole
    max_token_len_per_gpu: int = 16384
    # Where the RM's ranks run: their own Ray resource pool of num_workers slots, or the actor's pool
    # (one RM rank beside each actor rank; num_workers is then the actor's rank count)
    placement: Literal["separate", "colocated"] = "separate"
    placement_timeout_s: float = 300.0  # how long the RM's own ranks may wait for Ray to free their resources
    min_reward_gap: float = 0.0
    # What ranks a group's responses (the pair source): vllm_rm's verifiable score by default; a list is tried in
    # order, per group (the first with a gap decides). "rm_scores" (the policy's reward) includes the RM's own
    # score, so the RM would learn from its own judgement there.
    reward_key: list[str] = field(default_factory=lambda: ["verifiable_score"])
    num_workers: int = 1
    use_gpu: bool = True
    api_key: str | None = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    # training_mode lora: what a publish sends (the publisher's lora_wire): the adapters when the server holds the
    # base weights (auto, else merged weights with a warning), the adapters or a refusal, or merged weights
    lora_wire: Literal["auto", "adapters", "merged"] = "auto"
    timeout_s: float = 300.0
    parity_every: int = 0  # run the parity probe after every N publishes (0: never)
    parity_threshold: float = 1.05
    # PPO steps in a row without an RM step (no preference pairs) before the run fails (0: never): a run that asked
    # for online RM training never silently trains none
    max_idle_steps: int = 10
    # verl's asynchronous trainers only: the RM versions one PPO batch may have been scored by. Finished prompt
    # groups scored below (newest published version - max_staleness + 1) are evicted and replaced, as verl evicts
    # groups past trainer.v1.sampler.max_off_policy_threshold (None: no bound)
    max_staleness: int | None = None

    def __post_init__(self) -> None:
        if (self.server_url is None) == (self.reward_model is None):
            raise ValueError("online_rm needs exactly one of server_url (one server) and reward_model (the managed "
                             f"replicas of that RM), got server_url={self.server_url!r}, "
                             f"reward_model={self.reward_model!r}")
        mode = RewardModelTrainingMode.parse(self.training_mode)
        if self.lora_wire != "auto" and mode is not RewardModelTrainingMode.LORA:
            raise ValueError(f"online_rm.lora_wire={self.lora_wire!r} decides what a LoRA publish sends, and "
                             f"training_mode is {mode.value}: drop lora_wire or train with training_mode=lora")
        check_ranges(self, {"> 0": ("lr", "clip_grad", "timeout_s", "placement_timeout_s"),
                            ">= 1": ("publish_every", "lora_rank", "lora_alpha", "micro_batch_size_per_gpu",
                                     "max_token_len_per_gpu", "num_workers", "bucket_bytes", "max_staleness"),
                            ">= 0": ("parity_every", "max_idle_steps", "min_reward_gap", "weight_decay")})
        if self.fsdp_size != -1 and self.fsdp_size < 1:
            raise ValueError(f"fsdp_size must be -1 (all RM ranks) or >= 1, got {self.fsdp_size}")

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
        model = HFModelConfig(path=self.model_path, lora_rank=self.lora_rank if lora else 0,
                              lora_alpha=self.lora_alpha, target_modules=self.target_modules,
                              enable_gradient_checkpointing=self.enable_gradient_checkpointing,
                              use_remove_padding=self.use_remove_padding,
                              override_config={"attn_implementation": self.attn_implementation})
        engine = FSDPEngineConfig(strategy=self.strategy, param_offload=self.param_offload,
                                  optimizer_offload=self.optimizer_offload, fsdp_size=self.fsdp_size,
                                  model_dtype="fp32", mixed_precision={"param_dtype": self.param_dtype},
                                  micro_batch_size_per_gpu=self.micro_batch_size_per_gpu,
                                  use_dynamic_bsz=self.use_dynamic_bsz, max_token_len_per_gpu=self.max_token_len_per_gpu,
                                  use_torch_compile=False)
        optim = FSDPOptimizerConfig(lr=self.lr, weight_decay=self.weight_decay, clip_grad=self.clip_grad)
        return TrainingWorkerConfig(model_type=MODEL_TYPE, model_config=model, engine_config=engine,
                                    optimizer_config=optim, checkpoint_config=CheckpointConfig())
