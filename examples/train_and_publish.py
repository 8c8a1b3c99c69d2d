"""Train the RM with Bradley-Terry steps in each mode and publish after every step.

After each publish the server scores exactly like the trainer's model.

    .venv/bin/python examples/train_and_publish.py [head_only|lora|full ...]
"""

import sys
import tempfile

import requests
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from verl_vllm_rm.dev.tiny_task import encode_pairs, preference_pairs
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.weight_sync import RewardModelPublisher
from verl_vllm_rm.dev.tiny_rm import build_tiny_rm
from verl_vllm_rm.dev.offline_bt import OfflineBradleyTerry
from verl_vllm_rm.online.trainable import prepare_reward_model


def train_and_publish(server_url: str, model_path: str, modes: list[str], steps: int = 3) -> list[dict]:
    """BT steps from the model at ``model_path``, each published; one record per step with the parity."""
    tok = AutoTokenizer.from_pretrained(model_path)
    pairs = preference_pairs(64, seed=1)
    batch = encode_pairs(tok, pairs)
    probes = [tok(p.prompt + p.chosen).input_ids for p in pairs[:8]]
    records = []
    with RewardModelPublisher(server_url) as publisher:
        for mode in modes:
            base = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=torch.float32)
            model = prepare_reward_model(base, mode)
            trainer = OfflineBradleyTerry(model, lr=5e-3)
            for _ in range(steps):
                loss = trainer.step(batch)["rm/bt_loss"]
                result = publisher.publish(model, publisher.version + 1, mode)
                served = [d["score"] for d in requests.post(f"{server_url}/score",
                                                            json={"input": probes}).json()["data"]]
                diff = max(abs(a - b) for a, b in zip(served, sequence_scores(model.eval(), probes)))
                print(f"{mode:>9}: loss {loss:.4f}  published v{result.version} ({result.num_params} tensors, "
                      f"{result.seconds * 1000:.0f} ms)  max |server - trainer| = {diff:.1e}")
                records.append({"mode": mode, "loss": loss, "version": result.version, "max_diff": diff})
    return records


if __name__ == "__main__":
    path = str(build_tiny_rm(tempfile.mkdtemp() + "/tiny-rm"))
    with running_server(path, ["--dtype", "float32", "--enforce-eager", "--enable-weight-updates"]) as server:
        train_and_publish(server.url, path, sys.argv[1:] or ["head_only", "lora", "full"])
