"""Weight-sync cost: a publish vs a raw broadcast of the same bytes over the same transport.

For each model (the tiny RM and a ~100M-parameter RM built locally) and each mode
(head_only, full, and LoRA rank 16 sent two ways: ``lora_merged``, the merged weights,
and ``lora_adapters``, the adapters merged by the server from its base store) this
measures, on this machine:
  publish - ``RewardModelPublisher.publish`` into a real server started with
            ``--enable-weight-updates`` (names, checks, HTTP metadata, packing,
            broadcast, the server's staged receive, layerwise reload, prefix-cache
            reset, version bump), from call to return;
  raw     - the same bucket sizes broadcast over a fresh process group of the same
            backend to a bare receiver process (preallocated buffers, no packing),
            ending with the receiver's one-element acknowledgement.
Reports medians, the ratio (target <= 1.2), bytes/s, the server's receive and reload
times, and per model a row of merged / adapters ratios; writes
``benchmarks/results/weight_sync.json``.

``--trainer-side-only`` (for a GPU machine without vllm) measures the trainer's
part alone on the local accelerator: gathering DTensor shards and packing buckets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import torch

from verl_vllm_rm.client.http import free_port
from verl_vllm_rm.protocol.inventory import ParamSpec
from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES, BufferPool, open_group, pack, plan_buckets
from verl_vllm_rm.dev.tiny_rm import RM_100M, TinyRMSpec, build_tiny_rm

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {
    "tiny": TinyRMSpec(),
    "100m": RM_100M,
}
LORA_WIRES = {"lora_merged": "merged", "lora_adapters": "adapters"}  # bench-only modes: training_mode lora, each wire
LORA_RANK = 16
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--enable-weight-updates"]


def rank_device(backend: str) -> torch.device | None:
    """This process's CUDA device for nccl (read on the main thread), none for gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None


def acknowledge(group, ack: torch.Tensor, world_size: int) -> None:
    """Every receiver (ranks 1..world_size-1) broadcasts its one-element acknowledgement."""
    for rank in range(1, world_size):
        group.broadcast(ack, root=rank).wait()


def raw_receiver(argv: list[str]) -> None:
    """Subprocess: join the group as ``rank`` of ``world_size``, receive the given bucket sizes ``reps`` times,
    ack each round."""
    backend, port, session, sizes, reps = argv[0], int(argv[1]), argv[2], json.loads(argv[3]), int(argv[4])
    rank, world_size = int(argv[5]), int(argv[6])
    group = open_group(backend, "127.0.0.1", port, rank, world_size, 120.0, session, device=rank_device(backend))
    buffers = [torch.empty(n, dtype=torch.uint8, device=group.device) for n in sizes]
    ack = torch.ones(1, device=group.device)
    for _ in range(reps):
        for buf in buffers:
            group.broadcast(buf).wait()
        acknowledge(group, ack, world_size)


def raw_broadcast_s(backend: str, sizes: list[int], reps: int, receivers: int = 1,
                    round_start: Callable[[], object] | None = None) -> list[float]:
    """Trainer side of the raw baseline: the same buckets, preallocated, two in flight like a publish, to
    ``receivers`` bare receiver processes in one group; ``round_start()`` before each timed round (a barrier
    that lines up the rounds of senders in other threads)."""
    port, session, world_size = free_port(), uuid.uuid4().hex, receivers + 1
    procs = [subprocess.Popen([sys.executable, __file__, "--raw-receiver", backend, str(port), session,
                               json.dumps(sizes), str(reps), str(rank), str(world_size)])
             for rank in range(1, world_size)]
    group = open_group(backend, "127.0.0.1", port, 0, world_size, 120.0, session, device=rank_device(backend))
    buffers = [torch.ones(n, dtype=torch.uint8, device=group.device) for n in sizes]
    ack = torch.zeros(1, device=group.device)
    times = []
    for _ in range(reps):
        if round_start is not None:
            round_start()
        t0 = time.perf_counter()
        works = []
        for buf in buffers:
            works.append(group.broadcast(buf))
            if len(works) > 1:
                works.pop(0).wait()
        for w in works:
            w.wait()
        acknowledge(group, ack, world_size)
        times.append(time.perf_counter() - t0)
    for proc in procs:
        proc.wait(timeout=60)
    return times


def bench_model(name: str, workdir: Path, modes: list[str], reps: int, bucket_bytes: int) -> list[dict]:
    from transformers import AutoModelForSequenceClassification

    from verl_vllm_rm.online.trainable import prepare_reward_model
    from verl_vllm_rm.replicas.launcher import running_server
    from verl_vllm_rm.weight_sync import RewardModelPublisher

    path = build_tiny_rm(workdir / name, MODELS[name])
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    lora_model = None
    if any(mode in LORA_WIRES for mode in modes):
        lora_model = prepare_reward_model(AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32),
                                          "lora", lora_rank=LORA_RANK, lora_alpha=2 * LORA_RANK)
    rows = []
    with running_server(path, SERVER_ARGS) as server:
        for mode in modes:
            wire = LORA_WIRES.get(mode)
            training_mode, target = ("lora", lora_model) if wire else (mode, model)
            # one publisher (one communicator) at a time: the server serves the newest session only
            with RewardModelPublisher(server.url, bucket_bytes=bucket_bytes, timeout_s=300,
                                      lora_wire=wire or "auto") as pub:
                pub.connect()
                results = []
                for _ in range(reps + 1):  # the first round warms up both sides
                    perturb(target, wire is not None)
                    results.append(pub.publish(target, pub.version + 1, training_mode))
                results = results[1:]
                specs = [item.spec for item in pub.plan(target, training_mode).items]
                sizes = [b.nbytes for b in plan_buckets(specs, bucket_bytes)]
                raw = raw_broadcast_s(pub.transport, sizes, reps + 1)[1:]
                publish_s = statistics.median(r.seconds for r in results)
                raw_s = statistics.median(raw)
                nbytes = results[0].num_bytes
                rows.append({
                    "model": name, "model_params": n_params, "mode": mode, "transport": pub.transport,
                    "tensors": results[0].num_params, "bytes": nbytes, "buckets": results[0].num_buckets,
                    "lora_adapters": results[0].lora_adapters,
                    "publish_s": publish_s, "raw_broadcast_s": raw_s, "ratio": publish_s / raw_s,
                    "publish_bytes_per_s": nbytes / publish_s, "raw_bytes_per_s": nbytes / raw_s,
                    "server_receive_s": statistics.median(r.server["receive_s"] for r in results),
                    "server_reload_s": statistics.median(r.server["reload_s"] for r in results),
                    "server_pause_wait_s": statistics.median(r.server["pause_wait_s"] for r in results),
                })
                print(json.dumps(rows[-1]), flush=True)
    by_mode = {r["mode"]: r for r in rows}
    if set(LORA_WIRES) <= by_mode.keys():  # merged against adapters, on this model
        merged, adapters = by_mode["lora_merged"], by_mode["lora_adapters"]
        rows.append({"model": name, "mode": "lora_merged / lora_adapters",
                     **{f"{k}_ratio": merged[k] / adapters[k] for k in ("bytes", "publish_s", "server_receive_s",
                                                                        "server_reload_s")}})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def perturb(model: torch.nn.Module, lora: bool) -> None:
    """A new weight version: every LoRA B factor moves (``lora``), else the head does."""
    with torch.no_grad():
        if not lora:
            model.score.weight.add_(0.01)
            return
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.02)


def trainer_side_only(reps: int, bucket_bytes: int) -> list[dict]:
    """Gather (DTensor over a 1-rank mesh) and pack the 100M model's full state on the local device."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from transformers import AutoModelForSequenceClassification, Qwen2Config

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    spec = MODELS["100m"]
    config = Qwen2Config(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
                         intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
                         num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
                         num_labels=1, pad_token_id=0)
    model = AutoModelForSequenceClassification.from_config(config).to(device, torch.bfloat16)
    mesh = init_device_mesh(device.type, (1,))
    sharded = {n: distribute_tensor(t.detach(), mesh, [Shard(0)]) for n, t in model.state_dict().items()}
    rows = []
    for wire_dtype in ("bfloat16", "float32"):
        specs = [ParamSpec(n, wire_dtype, tuple(t.shape)) for n, t in sorted(sharded.items())]
        buckets = plan_buckets(specs, bucket_bytes)
        pool = BufferPool(device)
        gather_s, pack_s = [], []
        for _ in range(reps + 1):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            full = {s.name: sharded[s.name].full_tensor() for s in specs}
            if cuda:
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            for i, b in enumerate(buckets):
                pack(b, [full[s.spec.name] for s in b.slots], pool.get(i % 2, b.nbytes))
            if cuda:
                torch.cuda.synchronize()
            gather_s.append(t1 - t0)
            pack_s.append(time.perf_counter() - t1)
        nbytes = sum(b.nbytes for b in buckets)
        row = {"device": torch.cuda.get_device_name() if cuda else "cpu", "wire_dtype": wire_dtype,
               "params": sum(t.numel() for t in sharded.values()), "bytes": nbytes, "buckets": len(buckets),
               "gather_s": statistics.median(gather_s[1:]), "pack_s": statistics.median(pack_s[1:]),
               "pack_bytes_per_s": nbytes / statistics.median(pack_s[1:])}
        rows.append(row)
        print(json.dumps(row), flush=True)
    dist.destroy_process_group()
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-receiver":
        return raw_receiver(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,100m")
    parser.add_argument("--modes", default="head_only,full,lora_merged,lora_adapters")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES)
    parser.add_argument("--trainer-side-only", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_rule_rewards, run from anywhere
    from bench_rule_rewards import machine as machine_info

    machine = {**machine_info(), "torch": torch.__version__}
    if args.trainer_side_only:
        out = args.out or RESULTS / "weight_sync_trainer_side.json"
        rows = trainer_side_only(args.reps, args.bucket_bytes)
    else:
        out = args.out or RESULTS / "weight_sync.json"
        with tempfile.TemporaryDirectory() as tmp:
            rows = [r for m in args.models.split(",") for r in bench_model(m, Path(tmp), args.modes.split(","),
                                                                          args.reps, args.bucket_bytes)]
    out.parent.mkdir(parents=True, exist_ok=True)
    date = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    out.write_text(json.dumps({"date": date, "machine": machine, "bucket_bytes": args.bucket_bytes, "results": rows},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
