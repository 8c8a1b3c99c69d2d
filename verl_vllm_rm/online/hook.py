"""verl integration: a reward-model training worker and the publish hook that follows each step.

verl 0.9.1 ships no RM training worker, so this module provides one:
:class:`RewardModelTrainingWorker` runs a Bradley-Terry step (head-only, LoRA or
full) as a ``@register``-dispatched worker method, and after every step its
:class:`PublishAfterStep` hook pushes the new weights into the reward server
(every ``publish_every`` steps). :class:`OnlineRewardModel` drives a worker
group from the trainer: it turns a rollout batch into best-vs-worst preference
pairs and runs the step. ``online_trainer.py`` plugs this into verl's PPO loop.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.parity.probe import ParityProbe
from verl_vllm_rm.weight_sync.publisher import RewardModelPublisher
from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES
from verl_vllm_rm.online.bt import (
    BradleyTerryTrainer,
    PreferenceBatch,
    collate_pairs,
    prepare_reward_model,
    sequence_rewards,
)
from verl_vllm_rm.online.pairs import best_vs_worst_pairs

RM_STATE_FILE = "rm_state.pt"
PAIR_FIELDS = ("chosen_input_ids", "chosen_attention_mask", "rejected_input_ids", "rejected_attention_mask")


@dataclass
class OnlineRMConfig:
    """Options of online RM training (``+online_rm.*`` in a verl run; see docs/weight_sync.md)."""

    model_path: str
    server_url: str
    training_mode: str = "head_only"
    publish_every: int = 1
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_target_modules: Any = "all-linear"
    min_reward_gap: float = 0.0
    # What ranks a group's responses: vllm_rm's verifiable score by default. "rm_scores" (the policy's
    # reward) includes the RM's own score, so the RM would learn from its own judgement.
    reward_key: str = "verifiable_score"
    num_workers: int = 1
    use_gpu: bool = True
    api_key: str | None = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = 300.0
    parity_every: int = 0  # run the parity probe after every N publishes (0: never)
    parity_threshold: float = 1.05

    def __post_init__(self) -> None:
        RewardModelTrainingMode.parse(self.training_mode)
        if self.publish_every < 1:
            raise ValueError(f"online_rm.publish_every must be >= 1, got {self.publish_every}")
        if self.parity_every < 0:
            raise ValueError(f"online_rm.parity_every must be >= 0 (0 turns the probe off), got {self.parity_every}")

    def parity_probe(self) -> ParityProbe | None:
        return ParityProbe(every=self.parity_every, threshold=self.parity_threshold) if self.parity_every else None

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> "OnlineRMConfig":
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise ValueError(f"unknown online_rm option(s) {unknown}; valid options: {valid}")
        return cls(**options)


class PublishAfterStep:
    """The hook run after each RM step: publish every ``every`` steps, versions counting up."""

    def __init__(self, make_publisher: Callable[[], RewardModelPublisher], mode: RewardModelTrainingMode | str,
                 every: int = 1) -> None:
        self.make_publisher = make_publisher
        self.mode = RewardModelTrainingMode.parse(mode)
        self.every = every
        self.publisher: RewardModelPublisher | None = None

    def __call__(self, step: int, model: torch.nn.Module,
                 probe_ids: Sequence[Sequence[int]] | None = None) -> dict[str, float]:
        """Publish after step ``step`` when due; ``probe_ids`` feed the publisher's parity probe."""
        if step % self.every:
            return {}
        return self.publish(model, probe_ids)

    def publish(self, model: torch.nn.Module, probe_ids: Sequence[Sequence[int]] | None = None) -> dict[str, float]:
        """Publish ``model`` now, under the next version."""
        if self.publisher is None:
            self.publisher = self.make_publisher()
        result = self.publisher.publish(model, self.publisher.version + 1, self.mode, probe_ids=probe_ids)
        metrics = {"rm/published_version": float(result.version), "rm/publish_s": result.seconds,
                   "rm/publish_bytes": float(result.num_bytes)}
        if result.parity is not None:
            metrics.update({f"rm/parity_{k}": float(result.parity[k])
                            for k in ("max_abs_diff", "mean_abs_diff", "mult_error")})
        return metrics


class RewardModelTrainingWorker(Worker):
    """One rank of the reward-model trainer (ranks hold replicas; gradients are averaged)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.config = OnlineRMConfig.from_dict(config)
        self.device = torch.device("cuda" if self.config.use_gpu and torch.cuda.is_available() else "cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from transformers import AutoModelForSequenceClassification

        cfg = self.config
        group = None
        if self.world_size > 1:
            if not dist.is_initialized():
                dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
            group = dist.group.WORLD
        model = AutoModelForSequenceClassification.from_pretrained(cfg.model_path, dtype=torch.float32)
        model = prepare_reward_model(model.to(self.device), cfg.training_mode, lora_rank=cfg.lora_rank,
                                     lora_alpha=cfg.lora_alpha, lora_target_modules=cfg.lora_target_modules)
        self.trainer = BradleyTerryTrainer(model, lr=cfg.lr, max_grad_norm=cfg.max_grad_norm, grad_group=group)
        self.probes: list[list[int]] = []  # the last step's chosen sequences: the parity probe's inputs
        self.hook = PublishAfterStep(
            lambda: RewardModelPublisher(cfg.server_url, api_key=cfg.api_key, bucket_bytes=cfg.bucket_bytes,
                                         timeout_s=cfg.timeout_s, group=group,
                                         parity_probe=cfg.parity_probe()),
            cfg.training_mode,
            cfg.publish_every,
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_rm_step(self, pairs: DataProto) -> DataProto:
        """One Bradley-Terry step on this rank's share of the pairs, then the publish hook."""
        batch = PreferenceBatch(*(pairs.batch[k].to(self.device) for k in PAIR_FIELDS))
        metrics = self.trainer.step(batch)
        self.probes = [ids[mask.bool()].tolist() for ids, mask in zip(batch.chosen_ids, batch.chosen_mask)]
        metrics.update(self.hook(self.trainer.steps, self.trainer.model, self.probes))
        with torch.no_grad():
            margin = self._rewards(batch.chosen_ids, batch.chosen_mask) - self._rewards(
                batch.rejected_ids, batch.rejected_mask)
        return DataProto(batch=TensorDict({"rm_margin": margin.cpu()}, batch_size=[len(batch)]),
                         meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_rm_checkpoint(self, path: str) -> None:
        """Rank 0 writes the RM's training state to ``path/RM_STATE_FILE`` (ranks hold identical replicas)."""
        if self.rank == 0:
            os.makedirs(path, exist_ok=True)
            target = os.path.join(path, RM_STATE_FILE)
            torch.save({**self.trainer.state_dict(), "probes": self.probes}, f"{target}.tmp")
            os.replace(f"{target}.tmp", target)  # a crash mid-write never leaves a truncated checkpoint

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_rm_checkpoint(self, path: str | None) -> dict[str, float]:
        """Restore the training state saved at ``path`` (``None``: keep the initial RM), then publish it, so
        the server, whatever it served before, scores like this model again."""
        if path is not None:
            state = torch.load(os.path.join(path, RM_STATE_FILE), map_location="cpu", weights_only=True)
            self.trainer.load_state_dict(state)
            self.probes = state["probes"]
        # Any in-vocabulary ids serve the parity probe when no step has run yet.
        return self.hook.publish(self.trainer.model, self.probes or [list(range(1, 17))])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reference_scores(self, token_ids: list[list[int]]) -> list[float]:
        """This rank's model scores (transformers): what the server must answer after a publish."""
        from verl_vllm_rm.parity.reference import sequence_scores

        return sequence_scores(self.trainer.model, token_ids)

    def _rewards(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return sequence_rewards(self.trainer.model, ids, mask)


def preference_pairs(uids: Sequence[Hashable], sequences: Sequence[list[int]], rewards: Sequence[float],
                     pad_id: int, min_gap: float = 0.0, multiple_of: int = 1) -> DataProto | None:
    """Best-vs-worst pairs of each group as a ``DataProto`` (``None`` when no group has a gap).

    Trimmed to a multiple of the worker count, as ``DP_COMPUTE_PROTO`` splits evenly.
    """
    chosen, rejected = best_vs_worst_pairs(uids, sequences, rewards, min_gap)
    keep = len(chosen) - len(chosen) % multiple_of
    if keep == 0:
        return None
    batch = collate_pairs(chosen[:keep], rejected[:keep], pad_id)
    tensors = dict(zip(PAIR_FIELDS, (batch.chosen_ids, batch.chosen_mask, batch.rejected_ids, batch.rejected_mask)))
    return DataProto.from_dict(tensors=tensors)


class OnlineRewardModel:
    """The trainer-side handle: a Ray worker group training the RM on each rollout batch."""

    def __init__(self, config: OnlineRMConfig, pad_id: int) -> None:
        import ray
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        self.config = config
        self.pad_id = pad_id
        # Ray actor names are global: a unique prefix lets several of these live in one Ray session.
        name = f"online_rm_{uuid.uuid4().hex[:6]}"
        # One worker per bundle (verl's default reserves 10 CPUs per bundle for colocated roles).
        pool = RayResourcePool([config.num_workers], use_gpu=config.use_gpu, max_colocate_count=1, name_prefix=name)
        worker = RayClassWithInitArgs(cls=ray.remote(RewardModelTrainingWorker),
                                      config=dataclasses.asdict(config))
        self.worker_group = RayWorkerGroup(pool, worker, name_prefix=name)
        self.worker_group.init_model()

    def train_on_rollout(self, uids: Sequence[Hashable], sequences: Sequence[list[int]],
                         rewards: Sequence[float]) -> dict[str, float]:
        pairs = preference_pairs(uids, sequences, rewards, self.pad_id, self.config.min_reward_gap,
                                 self.worker_group.world_size)
        if pairs is None:
            return {"rm/pairs": 0.0}
        out = self.worker_group.train_rm_step(pairs)
        # One value per rank (``DataProto.concat`` lists them): report the mean.
        return {k: sum(v) / len(v) if isinstance(v, list) else v for k, v in out.meta_info["metrics"].items()}

    def save_checkpoint(self, path: str) -> None:
        """Write the RM's training state (trainable weights, optimizer, step count) under ``path``."""
        self.worker_group.save_rm_checkpoint(path)

    def resume(self, path: str | None) -> dict[str, float]:
        """Restore :meth:`save_checkpoint`'s state from ``path`` (``None``: the initial RM) and publish it."""
        return self.worker_group.load_rm_checkpoint(path)[0]
