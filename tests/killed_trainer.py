"""A trainer process that dies (SIGKILL) in the middle of a publish: fault injection only.

Usage: killed_trainer.py URL MODEL_PATH VERSION KILL_AFTER_BUCKETS TIMEOUT_S

It publishes a perturbed copy of the model in small buckets and kills itself once
KILL_AFTER_BUCKETS buckets have reached the server, so the server holds part of
an update and never gets the rest.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from verl_vllm_rm.weight_sync import RewardModelPublisher
from verl_vllm_rm.protocol.wire import TransferGroup


def main() -> None:
    url, model_path, version, kill_after, timeout_s = sys.argv[1:6]
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sent = []
    broadcast = TransferGroup.broadcast

    def broadcast_then_die(self, tensor, root=0):
        work = broadcast(self, tensor, root)
        sent.append(work)
        if len(sent) == int(kill_after):
            work.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        return work

    TransferGroup.broadcast = broadcast_then_die
    pub = RewardModelPublisher(url, timeout_s=float(timeout_s), bucket_bytes=64 << 10)
    pub.publish(model.state_dict(), int(version), "full")
    print("publish completed: the fault was not injected", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
