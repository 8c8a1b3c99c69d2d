"""Online RM training inside a verl PPO/GRPO run (opt-in): trainer mode ``vllm_rm_online``.

After each PPO step this trainer reads the step's rollouts (``uid``, prompt and
response ids, reward) from verl's TransferQueue, builds best-vs-worst preference
pairs per prompt group, and runs one Bradley-Terry step on a separate Ray worker
group (:class:`~verl_vllm_rm.sync.hook.OnlineRewardModel`), whose hook publishes
the new RM weights into the running reward server.

Enable it (see ``recipes/grpo_math_online_rm.sh``)::

    VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.sync.online_trainer \\
    python -m verl.trainer.main_ppo trainer.v1.trainer_mode=vllm_rm_online \\
        +online_rm.model_path=... +online_rm.server_url=... [+online_rm.training_mode=lora ...]

verl imports this module in every process through ``VERL_USE_EXTERNAL_MODULES``,
so the trainer mode is registered where verl's task runner looks it up. Needs
verl's v1 trainer dependencies (``transfer_queue``): on a machine without them
importing this module raises ImportError naming the missing package.
"""

from __future__ import annotations

import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from verl.single_controller.ray import RayResourcePool
from verl.trainer.ppo.v1 import get_trainer_cls, register_trainer
from verl.utils.debug import marked_timer

from verl_vllm_rm.sync.hook import OnlineRewardModel, OnlineRMConfig

TRAINER_MODE = "vllm_rm_online"


def _rewards(values) -> list[float]:
    """Per-sample reward: token-level scores (jagged) summed, or one value per sample."""
    if isinstance(values, torch.Tensor) and values.is_nested:
        return [float(v.sum()) for v in values.unbind()]
    if isinstance(values, torch.Tensor):
        return values.reshape(values.shape[0], -1).sum(-1).tolist()
    return [float(v) for v in list(values)]


@register_trainer(TRAINER_MODE)
class OnlineRewardModelTrainer(get_trainer_cls("sync")):
    """verl's synchronous v1 trainer plus one RM step (and publish) per PPO step."""

    def init(self):
        super().init()
        options = OmegaConf.to_container(self.config.online_rm, resolve=True)
        config = OnlineRMConfig.from_dict(options)
        pool = RayResourcePool([config.num_workers], use_gpu=config.use_gpu, name_prefix="online_rm")
        self.online_rm = OnlineRewardModel(config, pool, self.tokenizer.pad_token_id)

    def step(self, metrics: dict, timing_raw: dict):
        batch = super().step(metrics, timing_raw)
        key = self.online_rm.config.reward_key
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "prompts", "responses", key])
        sequences = [torch.cat([p, r]).tolist() for p, r in zip(data["prompts"].unbind(), data["responses"].unbind())]
        with marked_timer("online_rm", timing_raw, color="purple"):
            metrics.update(self.online_rm.train_on_rollout(list(data["uid"].tolist()), sequences, _rewards(data[key])))
        return batch
