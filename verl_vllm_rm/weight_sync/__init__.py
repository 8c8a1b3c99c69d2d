"""Reward-model weight sync: trainer-side publisher, names, checks and transport.

Importable without vllm (trainer side) and without verl (the server reuses the
pure parts: :mod:`names`, :mod:`inventory`, :mod:`wire`). Only :mod:`hook`
imports verl.
"""

from verl_vllm_rm.protocol.inventory import WeightUpdateRefused
from verl_vllm_rm.protocol.names import RewardModelTrainingMode
from verl_vllm_rm.parity.probe import ParityError, ParityProbe
from verl_vllm_rm.weight_sync.publisher import PublishResult, RewardModelPublisher, WeightSyncError

__all__ = [
    "ParityError",
    "ParityProbe",
    "PublishResult",
    "RewardModelPublisher",
    "RewardModelTrainingMode",
    "WeightSyncError",
    "WeightUpdateRefused",
]
