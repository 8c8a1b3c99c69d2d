"""One rank of a 2-rank trainer whose reward model is sharded (DTensor, Shard(0)).

Usage: sharded_trainer.py RANK WORLD_SIZE MASTER_PORT URL MODEL_PATH VERSION MODE

Every rank calls ``publish`` with its shards; rank 0 talks to the server and
every rank joins the all-gathers. Prints one JSON line with the result.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from verl_vllm_rm.weight_sync import RewardModelPublisher


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    url, model_path, version, mode = sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(7)  # the same perturbation on every rank: the full model is known to the test
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    mesh = init_device_mesh("cpu", (world,))
    sharded = {
        name: distribute_tensor(t.detach(), mesh, [Shard(0)]) if t.shape[0] % world == 0 else t
        for name, t in model.state_dict().items()
    }
    local_rows = {n: t.to_local().shape[0] for n, t in sharded.items() if hasattr(t, "to_local")}
    pub = RewardModelPublisher(url, timeout_s=60)
    result = pub.publish(sharded, version, mode)
    print(json.dumps({"rank": rank, "num_params": result.num_params, "sharded": len(local_rows),
                      "local_rows": local_rows.get("model.embed_tokens.weight")}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
