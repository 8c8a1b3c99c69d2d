"""Reward-model weight sync, the trainer side of an update: publisher, selection, LoRA on the wire, transfer.

Needs torch, not vllm. The parts both sides share (names, inventory, wire format)
live in :mod:`verl_vllm_rm.protocol`.
"""

from verl_vllm_rm.protocol.inventory import WeightUpdateRefused
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.parity.probe import ParityError, ParityProbe
from verl_vllm_rm.weight_sync.multi_server import MultiServerPublisher
from verl_vllm_rm.weight_sync.publisher import PublishResult, RewardModelPublisher
from verl_vllm_rm.weight_sync.transfer import WeightSyncError

__all__ = [
    "MultiServerPublisher",
    "ParityError",
    "ParityProbe",
    "PublishResult",
    "RewardModelPublisher",
    "RewardModelTrainingMode",
    "WeightSyncError",
    "WeightUpdateRefused",
]
