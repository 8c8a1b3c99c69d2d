"""One rank of the RM trainer: verl's ``TrainingWorker`` on :class:`~verl_vllm_rm.online.engine.RewardModelEngine`.

verl's worker gives the engine, ``train_batch`` (one optimizer step, gradients accumulated over
micro-batches) and checkpoints; this adds the RM's step (its share of the pairs, the BT loss),
the publish straight from the sharded engine after it, and the RM's resume.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils import tensordict_utils as tu
from verl.workers.config import TrainingWorkerConfig
from verl.workers.engine_workers import TrainingWorker

from verl_vllm_rm.online.bt import PAIR_GROUP, bradley_terry_loss, pair_batch
from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.engine import RewardModelEngine  # importing it registers it with verl
from verl_vllm_rm.online.export import rm_run_state, write_rm_run_state
from verl_vllm_rm.online.hook import PublishAfterStep
from verl_vllm_rm.online.state import sharded_state_bytes
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.weight_sync.multi_server import MultiServerPublisher

PROBES_KEPT = 8  # chosen sequences of the last step kept as the parity probe's inputs


def publish_targets(cfg: OnlineRMConfig) -> dict[str, Any]:
    """Where the RM's weights go: the ``server_url`` list (a failed server aborts the version everywhere, or with
    ``on_server_failure=leave_behind`` is left behind), or every replica of the managed RM ``reward_model`` (asked
    again at each publish, so a restarted replica is re-synced; a commit moves the fleet to the new version; a
    replica that fails its parity probe is drained and restarted)."""
    if cfg.server_url is not None:
        return {"server_urls": list(cfg.server_url), "leave_behind": cfg.on_server_failure == "leave_behind"}
    import ray

    from verl_vllm_rm.replicas.fleet import fleet_name

    fleet = ray.get_actor(fleet_name(cfg.reward_model))  # started by the trainer's set-up (FleetReadings)
    return {"server_urls": lambda: ray.get(fleet.replica_urls.remote()),
            "on_commit": lambda version: ray.get(fleet.set_version.remote(version)),
            "on_parity_failure": lambda url, reason: ray.get(fleet.drain.remote(url, reason))}


def micro_batch_pairs(pairs: int, limit: int) -> int:
    """The largest micro-batch of at most ``limit`` pairs that splits ``pairs`` evenly (verl's static
    micro-batches must), so no pair is dropped and gradients accumulate over equal micro-batches."""
    return max(size for size in range(1, min(pairs, limit) + 1) if pairs % size == 0)


class RewardModelWorker(TrainingWorker):
    """verl's training worker holding the RM; every method runs on all ranks (``ONE_TO_ALL``)."""

    def __init__(self, config: TrainingWorkerConfig, online: Mapping[str, Any]) -> None:
        super().__init__(config)
        if not isinstance(self.engine, RewardModelEngine):  # verl looks engines up by model_type and device
            # Built only by OnlineRewardModel, from OnlineRMConfig.training_worker_config().
            # internal: only RewardModelEngine registers that config's model_type (verl raises its own error else)
            raise TypeError(f"verl built a {type(self.engine).__name__} for the RM, not a RewardModelEngine: "
                            f"check that model_type={config.model_type!r} and the engine device are verl's FSDP ones")
        self.online = OnlineRMConfig.from_dict(online)
        self.engine.training_mode = RewardModelTrainingMode.parse(self.online.training_mode)
        self.steps = 0
        self.probes: list[list[int]] = []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the sharded model and its optimizer (verl's ``reset``), the loss, the publish hook."""
        cfg = self.online
        self.engine.initialize()
        self.loss_fn = bradley_terry_loss
        # verl frees the gradients when a step ends and Adam's moments appear at the first update: read this
        # rank's state at the update, where both are held.
        self.peak_state: dict[str, int] = {}
        self.engine.optimizer.register_step_post_hook(
            lambda *_: setattr(self, "peak_state", sharded_state_bytes(self.engine.module, self.engine.optimizer)))
        self.hook = PublishAfterStep(
            lambda: MultiServerPublisher(**publish_targets(cfg), api_key=cfg.api_key, bucket_bytes=cfg.bucket_bytes,
                                         timeout_s=cfg.timeout_s, parity_probe=cfg.parity_probe(),
                                         lora_wire=cfg.lora_wire),
            cfg.training_mode, cfg.publish_every)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train_rm_step(self, chosen: Sequence[Sequence[int]], rejected: Sequence[Sequence[int]]) -> dict[str, Any]:
        """One BT step: each rank takes its contiguous share of the pairs (as many as every other rank), verl
        runs the micro-batches and the optimizer step; then the publish hook. The step's metrics."""
        rank, world = self.engine.get_data_parallel_rank(), self.engine.get_data_parallel_size()
        if len(chosen) % world:  # internal: train_on_rollout trims the pairs to a multiple of the ranks
            raise ValueError(f"{len(chosen)} pairs do not split evenly over {world} RM ranks")
        share = len(chosen) // world
        mine = slice(rank * share, (rank + 1) * share)
        data = pair_batch(chosen[mine], rejected[mine])
        cfg = self.online
        tu.assign_non_tensor(
            data, temperature=1.0, force_group_size=PAIR_GROUP, update_lr_scheduler=True,
            global_token_num=data["input_ids"].offsets().diff().tolist(),
            micro_batch_size_per_gpu=micro_batch_pairs(share, cfg.engine.micro_batch_size_per_gpu),
            use_dynamic_bsz=cfg.engine.use_dynamic_bsz, max_token_len_per_gpu=cfg.engine.max_token_len_per_gpu)
        output = self.train_batch(data)
        self.steps += 1
        self.probes = [list(s) for s in chosen[:PROBES_KEPT]]  # the same on every rank: the probe is collective
        metrics = tu.get(output, "metrics") if output is not None else {}
        metrics = {"rm/bt_loss": metrics.get("loss"), "rm/grad_norm": metrics.get("grad_norm"),
                   **{k: v for k, v in metrics.items() if k.startswith("rm/")}}
        # this rank's parameters + gradients + optimizer state at the update (the driver reports the largest)
        metrics["rm/state_bytes"] = float(self.peak_state.get("total", 0))
        return {**metrics, **self.hook(self.steps, self.engine.module, self.probes)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_rm_checkpoint(self, path: str) -> None:
        """verl's checkpoint of the engine (each rank its shards and optimizer state), and what the RM run was:
        its step count, probes and the options that rebuild it (rank 0; :mod:`.export` reads it)."""
        self.engine.save_checkpoint(path, global_step=self.steps)
        if self.engine.get_data_parallel_rank() == 0:
            cfg = self.online
            write_rm_run_state(path, {
                "steps": self.steps, "probes": self.probes, "world_size": self.engine.get_data_parallel_size(),
                "training_mode": cfg.training_mode, "model_path": cfg.model_path, "lora_rank": cfg.model.lora_rank,
                "lora_alpha": cfg.model.lora_alpha, "target_modules": cfg.model.target_modules})
        torch.distributed.barrier()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_rm_checkpoint(self, path: str | None) -> dict[str, float]:
        """Restore the engine from its checkpoint at ``path`` (``None``: keep the initial RM), then publish it,
        so the server, whatever it served before, scores like this model again."""
        if path is not None:
            state = rm_run_state(path)
            world = self.engine.get_data_parallel_size()
            if (state["world_size"], state["training_mode"]) != (world, self.online.training_mode):
                raise ValueError(
                    f"the RM checkpoint at {path} was saved by {state['world_size']} RM rank(s) in training_mode="
                    f"{state['training_mode']}; this run has {world} in {self.online.training_mode}. verl's engine "
                    "checkpoints are per rank: resume with the same +online_rm.num_workers (or actor ranks when "
                    "colocated) and training_mode")
            self.engine.load_checkpoint(path)
            self.steps, self.probes = state["steps"], state["probes"]
        # Any in-vocabulary ids serve the parity probe when no step has run yet.
        return self.hook.publish(self.engine.module, self.probes or [list(range(1, 17))])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reference_scores(self, token_ids: list[list[int]]) -> list[float]:
        """The engine model's scores (every rank: a sharded forward is collective): what the server must
        answer after a publish."""
        from verl_vllm_rm.parity.reference import sequence_scores

        self.engine.module.eval()  # verl's train_batch puts it back in train mode
        return sequence_scores(self.engine.module, token_ids)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state_bytes(self) -> dict[str, int]:
        """This rank's bytes of parameters, gradients and optimizer state at the last step's optimizer update
        (gradients present), read from the engine's own tensors."""
        return self.peak_state
