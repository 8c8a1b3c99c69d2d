"""verl 0.9.1 ships no RM training worker; this is one.

:class:`RewardModelTrainingWorker` runs a Bradley-Terry step (head-only, LoRA or
full) as a ``@register``-dispatched worker method, then its
:class:`~verl_vllm_rm.online.hook.PublishAfterStep` hook pushes the new weights
into the reward server; it also saves and restores the RM's training state.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

from verl_vllm_rm.online.bt import BradleyTerryTrainer, PreferenceBatch, prepare_reward_model, sequence_rewards
from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.hook import PublishAfterStep
from verl_vllm_rm.weight_sync.multi_server import MultiServerPublisher

RM_STATE_FILE = "rm_state.pt"
PAIR_FIELDS = ("chosen_input_ids", "chosen_attention_mask", "rejected_input_ids", "rejected_attention_mask")


def publish_targets(cfg: OnlineRMConfig) -> dict[str, Any]:
    """Where the RM's weights go: ``server_url``, or every replica of the managed RM ``reward_model`` (asked
    again at each publish, so a restarted replica is re-synced; a commit moves the fleet to the new version)."""
    if cfg.server_url is not None:
        return {"server_urls": [cfg.server_url]}
    import ray

    from verl_vllm_rm.replicas.fleet import fleet_name

    fleet = ray.get_actor(fleet_name(cfg.reward_model))  # started by the trainer's set-up (FleetReadings)
    return {"server_urls": lambda: ray.get(fleet.replica_urls.remote()),
            "on_commit": lambda version: ray.get(fleet.set_version.remote(version))}


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
            lambda: MultiServerPublisher(**publish_targets(cfg), api_key=cfg.api_key, bucket_bytes=cfg.bucket_bytes,
                                         timeout_s=cfg.timeout_s, group=group, parity_probe=cfg.parity_probe()),
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
