"""A trainer process that dies (SIGKILL) at one phase of a publish: fault injection only.

Usage: killed_trainer.py PHASE URLS MODEL_PATH VERSION TIMEOUT_S

It publishes a perturbed copy of the model (seed 1, ``full``) in small buckets and kills itself at PHASE:

- ``init``: once the server joined its transfer group (``/init_communicator`` answered), before any update;
- ``bucket:N``: once N buckets have reached the server, the rest never sent;
- ``last_bucket``: a staged update (``commit=False``) whose last bucket reached the server, before the commit;
- ``stage_commit``: URLS is two servers; both stage the version, the first commits it, and the trainer dies
  before it commits the second.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
from sync_helpers import after_buckets

from verl_vllm_rm.protocol.wire import plan_buckets
from verl_vllm_rm.weight_sync import MultiServerPublisher, RewardModelPublisher

BUCKET_BYTES = 64 << 10


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_before_second_commit(first_url: str) -> None:
    """The first server's commit goes through; the trainer dies before any other's."""
    committed = threading.Event()
    commit = RewardModelPublisher.commit

    def commit_then_die(self, version):
        if self.server_url == first_url:
            record = commit(self, version)
            committed.set()
            return record
        committed.wait()
        die()

    RewardModelPublisher.commit = commit_then_die


def main() -> None:
    phase, urls, model_path, version, timeout_s = sys.argv[1:6]
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    options = dict(timeout_s=float(timeout_s), bucket_bytes=BUCKET_BYTES)
    if phase == "stage_commit":
        servers = urls.split(",")
        die_before_second_commit(servers[0])
        MultiServerPublisher(servers, **options).publish(model, int(version), "full")
    else:
        pub = RewardModelPublisher(urls, **options)
        if phase == "init":
            pub.connect()
            die()
        if phase == "last_bucket":
            specs = [item.spec for item in pub.plan(model, "full").items]
            after_buckets(len(plan_buckets(specs, BUCKET_BYTES)), die)
        else:
            after_buckets(int(phase.removeprefix("bucket:")), die)
        pub.publish(model, int(version), "full", commit=phase != "last_bucket")
    print("publish completed: the fault was not injected", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main()
