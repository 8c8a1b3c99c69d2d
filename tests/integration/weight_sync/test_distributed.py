"""A distributed trainer: DTensor-sharded parameters, every rank publishes, rank 0 sends."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from sync_helpers import assert_parity, load_rm, reset_server, runtime_version

from verl_vllm_rm.client.http import free_port
from repo_paths import SUPPORT

SHARDED_TRAINER = SUPPORT / "sharded_trainer.py"
WORLD = 2


def test_sharded_trainer_publishes_the_gathered_model(ws_server, tiny_rm, probe_ids):
    version = reset_server(ws_server.url, tiny_rm) + 1
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(SHARDED_TRAINER), str(rank), str(WORLD), str(port), ws_server.url, tiny_rm,
             str(version), "full"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(r["num_params"] == 27 and r["sharded"] > 0 for r in results)
    assert results[0]["local_rows"] < load_rm(tiny_rm).model.embed_tokens.weight.shape[0]  # really sharded

    expected = load_rm(tiny_rm)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in expected.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    assert runtime_version(ws_server.url) == version
    assert_parity(ws_server.url, expected, probe_ids)
