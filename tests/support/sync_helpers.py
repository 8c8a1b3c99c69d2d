"""Helpers shared by the weight-sync tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import requests
import torch

from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.protocol.names import is_head
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.server.weights.reload_fault import RELOAD_FAULT_ENV
from verl_vllm_rm.weight_sync import RewardModelPublisher

PARITY_ATOL = 1e-4
FAULT_SERVER_STALL_S = 12.0  # the fault server's --weight-update-stall-timeout (tests/integration/weight_sync/conftest.py)


def faulty_server(tiny_rm: str, server_args: list[str], fault_file: Path, *extra: str):
    """A real weight-update server (context manager) whose reloads fail as ``fault_file`` asks (the test-only
    switch ``RELOAD_FAULT_ENV``; absent: none)."""
    return running_server(tiny_rm, [*server_args, "--enable-weight-updates", *extra],
                          env={RELOAD_FAULT_ENV: str(fault_file)})


def after_buckets(n: int, action) -> None:
    """Fault injection on this process's trainer side: once the n-th bucket's broadcast has reached every receiver,
    ``action()`` (kill this trainer, stop the server's worker). Counts buckets only, not the warm-up broadcast
    that forms a group (one byte). Patches ``TransferGroup.broadcast``; the caller restores it if it lives on."""
    from verl_vllm_rm.protocol.wire import TransferGroup

    sent = []
    broadcast = TransferGroup.broadcast

    def broadcast_then_act(group, tensor, root=0):
        work = broadcast(group, tensor, root)
        if tensor.numel() > 1:
            sent.append(work)
            if len(sent) == n:
                work.wait()
                action()
        return work

    TransferGroup.broadcast = broadcast_then_act


def load_rm(path: str):
    """A fresh, trainable copy of the reward model (fp32)."""
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()


def perturbed(model, seed: int):
    """A copy of ``model`` with seeded noise (std 0.05) on every parameter: a distinct weight version."""
    out = copy.deepcopy(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return out


def server_scores(url: str, token_ids: list[list[int]]) -> list[float]:
    resp = requests.post(f"{url}/score", json={"input": token_ids}, timeout=60)
    assert resp.status_code == 200, resp.text
    return [d["score"] for d in resp.json()["data"]]


def runtime_version(url: str) -> int:
    return requests.get(f"{url}/runtime_version", timeout=10).json()["version"]


def update_record(url: str) -> dict:
    """What /health says about weight updates: the last one (applied or failed), the last failure, and the
    one being received or applied. Every update the server accepted changes it."""
    health = requests.get(f"{url}/health", timeout=10).json()
    return {key: health.get(key) for key in ("last_update", "last_failed_update", "pending_update")}


def wait_for_failed_update(url: str, version: int, deadline_s: float = 300) -> dict:
    """/health once it reports the failed update to ``version`` (``deadline_s``: a hang guard, not a speed bound)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        resp = requests.get(f"{url}/health", timeout=10)
        assert resp.status_code == 200, resp.text
        failed = resp.json().get("last_failed_update", {})
        if failed.get("version") == version:
            return resp.json()
        time.sleep(0.5)
    raise AssertionError(f"/health never reported the failed update to version {version}")


class UnreadableTensor(torch.Tensor):
    """Fault injection: a tensor whose shape and dtype pass every check, and whose data cannot be read when a
    publish packs it (``detach``, the packing's read, raises), as storage that fails on the trainer mid-publish."""

    MESSAGE = "injected: this tensor's data cannot be read"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.detach:
            raise RuntimeError(cls.MESSAGE)
        return super().__torch_function__(func, types, args, kwargs)


def unreadable(shape) -> torch.Tensor:
    return torch.zeros(shape).as_subclass(UnreadableTensor)


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def assert_parity(url: str, model, probe: list[list[int]]) -> list[float]:
    """The server scores the probe exactly like ``model`` in transformers; returns the scores."""
    served = server_scores(url, probe)
    reference = sequence_scores(model, probe)
    assert max_diff(served, reference) <= PARITY_ATOL, (served, reference)
    return served


def inventory_dtypes(url: str) -> tuple[dict[str, dict], tuple[str, ...]]:
    """The server's ``/weight_inventory``: each parameter's entry by name, and the head's name patterns."""
    inventory = requests.get(f"{url}/weight_inventory", timeout=30).json()
    return {p["name"]: p for p in inventory["params"]}, tuple(inventory["head_patterns"])


def mixed_precision_breaches(params: dict[str, dict], head_patterns: tuple[str, ...], backbone: str,
                             head: str = "float32") -> list[str]:
    """What breaks the mixed-precision promise in an inventory (an empty list when it holds): the head in
    ``head``, every backbone matrix in the ``backbone`` dtype, and any other parameter either in the backbone's
    dtype or a bias kept wider by vLLM's kernels (vLLM-CPU's small-GEMM path on AMX CPUs keeps a small linear's
    bias in float32: ``vllm/model_executor/layers/utils.py:dispatch_cpu_unquantized_gemm``)."""
    breaches = []
    for name, entry in sorted(params.items()):
        dtype, ndim = entry["dtype"], len(entry["shape"])
        if is_head(name, head_patterns):
            if dtype != head:
                breaches.append(f"head {name} is {dtype}, not {head}")
        elif dtype != backbone and (ndim != 1 or not name.endswith(".bias")):
            breaches.append(f"backbone {name} ({ndim}-D) is {dtype}, not {backbone}")
    return breaches


def reset_server(url: str, path: str) -> int:
    """Serve the on-disk model again (full publish); returns the new version."""
    with RewardModelPublisher(url, timeout_s=60) as pub:
        version = pub.version + 1
        pub.publish(load_rm(path), version, "full")
    return version


def engine_rm_config(model_path: str, url: str, mode: str, ranks: int, **options):
    """The RM trainer on verl's engine as the CPU tests run it: fp32, one pair per micro-batch, a parity probe
    after every publish."""
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE
    from verl_vllm_rm.online.config import OnlineRMConfig

    return OnlineRMConfig.from_dict(dict(model_path=model_path, server_url=url, training_mode=mode, lora_rank=4,
                                         lr=5e-3, timeout_s=60, parity_every=1, num_workers=ranks,
                                         micro_batch_size_per_gpu=1, **{**CPU_RM_ENGINE, **options}))
