"""Fault tolerance through the ``vllm_rm`` manager, against the real vLLM server.

A sustained 10,000-sample run with bounded memory, a server SIGKILLed mid-batch and
restarted on its port, and corrupted answers (5xx, a body cut mid-way, NaN, a wrong
score count) injected by the loopback proxy under both failure policies.
The slow-server fail-over case lives with the other routing tests in tests/integration/client/test_reward_client.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from verl_vllm_rm.client.reward_client import RewardServerError, VLLMRewardClient
from verl_vllm_rm.dev.grpo_batch import Group, build_batch, last_token_rewards, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.replicas.launcher import RewardServer, start_server
from verl_vllm_rm.client.http import free_port

from sustained_run import all_rows, step_groups
from repo_paths import SUPPORT

pytestmark = pytest.mark.server  # kills and restarts its own server

FAST = dict(backoff_base_s=0.01, backoff_max_s=0.05)
# Measured growth over the second half of the run is < 1 MiB; keeping each row's DataProto
# (the per-sample state a manager could leak) grows it by ~29 MiB, so 16 MiB catches that.
RSS_GROWTH_BOUND_MIB = 16.0


def reference(hf_model, groups: list[Group]) -> torch.Tensor:
    return torch.tensor(sequence_scores(hf_model, [row_token_ids(g, r) for g in groups for r in g.response_ids]))


# -- 1. sustained run -----------------------------------------------------------------------
def test_10k_samples_in_one_run_with_bounded_memory(rm_server, tiny_rm, hf_model, tmp_path):
    """Memory is measured in a process of its own; every score is checked against a reference."""
    script = SUPPORT / "sustained_run.py"
    out = tmp_path / "scores.npy"
    proc = subprocess.run([sys.executable, str(script), rm_server.url, tiny_rm, "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    print("sustained run:", json.dumps(figures))
    assert figures["samples"] == 10_000 and figures["failed"] == 0
    assert figures["growth_second_half_mib"] < RSS_GROWTH_BOUND_MIB, figures

    scores, rows = np.load(out), all_rows(figures["steps"])

    async def direct() -> list[float]:  # the same inputs in one plain client call
        async with VLLMRewardClient(rm_server.url) as client:
            return await client.score_batch(rows)

    assert np.abs(scores - np.array(asyncio.run(direct()))).max() < 1e-4  # no score crossed rows
    sample = np.random.default_rng(0).choice(len(rows), 32, replace=False)
    assert np.abs(scores[sample] - sequence_scores(hf_model, [rows[i] for i in sample])).max() < 1e-4


# -- 2. server killed mid-batch ---------------------------------------------------------------
@dataclass
class Restartable:
    """A dedicated server on a fixed port, so a restarted server answers at the same URL."""

    model: str
    args: list[str]
    port: int = field(default_factory=free_port)
    server: RewardServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ensure_running(self) -> float:
        if self.server is None or self.server.process.poll() is not None:
            self.server = start_server(self.model, self.args, port=self.port)
        return self.server.startup_s

    def answered(self) -> int:
        return self.server.log_path.read_text(errors="replace").count('"POST /score HTTP/1.1" 200')

    def kill(self) -> None:
        """SIGKILL the whole process group (API server and engine) and wait until it is gone."""
        pgid = self.server.process.pid
        os.killpg(pgid, signal.SIGKILL)
        self.server.process.wait()
        deadline = time.monotonic() + 30
        while any(_in_group(p, pgid) for p in psutil.process_iter()) and time.monotonic() < deadline:
            time.sleep(0.1)


def private_dir_of(pid: int) -> Path:
    """The server's private $TMPDIR (``verl_vllm_rm.server.runtime_dir``), found by its pid file."""
    for pid_file in Path(tempfile.gettempdir()).glob("vrm-*/server.pid"):
        if pid_file.read_text().split()[0] == str(pid):
            return pid_file.parent
    raise AssertionError(f"no private TMPDIR for server pid {pid}")


def _in_group(p: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.Error):
        return False


@pytest.fixture(scope="module")
def own_server(tiny_rm, server_args):
    srv = Restartable(tiny_rm, server_args)
    srv.ensure_running()
    try:
        yield srv
    finally:
        if srv.server is not None:
            srv.server.stop()


def kill_mid_batch(srv: Restartable, mgr, data) -> tuple[threading.Thread, dict]:
    """Start ``mgr(data)`` in a thread; SIGKILL the server once it has answered a request."""
    result: dict = {}

    def work() -> None:
        try:
            result["out"] = mgr(data, return_dict=True)
        except Exception as e:  # noqa: BLE001 - handed to the test
            result["error"] = e
        result["elapsed"] = time.monotonic() - t0

    before, t0 = srv.answered(), time.monotonic()
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    while srv.answered() == before and thread.is_alive() and time.monotonic() - t0 < 60:
        time.sleep(0.01)
    assert srv.answered() > before and thread.is_alive(), "the batch must be in flight when the server dies"
    result["killed_at"] = time.monotonic() - t0
    srv.kill()
    result["kill_s"] = time.monotonic() - t0 - result["killed_at"]
    return thread, result


def slow_batch(n_groups: int = 12) -> list[Group]:
    return [Group(p, rs) for p, rs in step_groups(99)[:n_groups]]


def test_batch_survives_server_kill_and_restart(load_manager, own_server, verl_config, tokenizer, hf_model):
    groups = slow_batch()
    # one sequence per request, one request at a time: ~100 requests keep the batch in flight
    cfg = verl_config(own_server.url, max_batch_seqs=1, max_concurrent_requests=1, max_retries=10_000,
                      deadline_s=600, backoff_max_s=1.0, max_length=512, num_examine=0)
    mgr = load_manager(cfg, tokenizer)
    data = build_batch(groups, tokenizer.pad_token_id)
    killed_dir = private_dir_of(own_server.server.process.pid)
    thread, result = kill_mid_batch(own_server, mgr, data)
    assert killed_dir.exists(), "a SIGKILLed server cannot remove its private TMPDIR"
    restart_s = own_server.ensure_running()
    assert not killed_dir.exists(), "the next start removes a dead server's private TMPDIR"
    thread.join(120)
    assert not thread.is_alive() and "error" not in result, result.get("error")
    print(f"kill/restart: killed {result['killed_at']:.2f}s into the batch (gone in {result['kill_s']:.2f}s), "
          f"restart {restart_s:.1f}s, "
          f"batch done after {result['elapsed']:.1f}s")
    assert torch.allclose(last_token_rewards(result["out"]["reward_tensor"], data), reference(hf_model, groups), atol=1e-4)
    assert result["out"]["reward_extra_info"]["rm_valid"] == [1.0] * len(data)


def test_kill_with_short_deadline_is_a_clear_error_in_time(load_manager, own_server, verl_config, tokenizer):
    own_server.ensure_running()  # the server restarted by the test above, if it ran
    deadline_s = 4.0
    cfg = verl_config(own_server.url, max_batch_seqs=1, max_concurrent_requests=1, max_retries=10_000,
                      deadline_s=deadline_s, backoff_max_s=0.5, max_length=512, num_examine=0)
    mgr = load_manager(cfg, tokenizer)
    thread, result = kill_mid_batch(own_server, mgr, build_batch(slow_batch(), tokenizer.pad_token_id))
    thread.join(deadline_s + 30)
    assert not thread.is_alive(), "the batch hangs after the server died"
    error = result.get("error")
    assert isinstance(error, RewardServerError), result
    assert own_server.url in str(error) and "connection failed" in str(error), str(error)
    # the deadline ended the retries (10,000 were allowed): the error names the bound that fired, not a duration
    assert f"attempt(s), deadline_s {deadline_s:g} s ran out (servers " in str(error), str(error)
    print(f"short deadline: error after {result['elapsed']:.2f}s (deadline {deadline_s}s): {error}")


# -- 4. injected faults through the manager -----------------------------------------------------
FAULTS = {  # fault -> (proxy settings for n answers, the cause the error must name)
    "5xx": (lambda n: dict(fail_status=503, fail_times=n), r"HTTP 503"),
    "truncated": (lambda n: dict(corrupt="truncated", corrupt_times=n), r"ClientPayloadError"),
    "nan": (lambda n: dict(corrupt="nan", corrupt_times=n), r"non-finite or non-numeric score nan"),
    "count": (lambda n: dict(corrupt="count", corrupt_times=n), r"returned 3 scores for 4 inputs"),
}


def faulty_manager(load_manager, proxy, verl_config, tokenizer, fault: str, times: int, **kwargs):
    for key, value in FAULTS[fault][0](times).items():
        setattr(proxy.faults, key, value)
    # one request per prompt group; max_length set so that only /score meets the fault
    cfg = verl_config(proxy.url, max_batch_seqs=4, max_length=512, **FAST, **kwargs)
    return load_manager(cfg, tokenizer)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_raise_policy_names_server_and_cause(fault, load_manager, fault_proxy, verl_config, tokenizer, grpo_groups):
    mgr = faulty_manager(load_manager, fault_proxy, verl_config, tokenizer, fault, 1000, max_retries=1)
    with pytest.raises(RewardServerError, match=r"after 2 attempt\(s\).*" + FAULTS[fault][1]) as err:
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))
    assert fault_proxy.url in str(err.value)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_mask_policy_flags_only_the_failed_group(fault, load_manager, fault_proxy, verl_config, tokenizer, hf_model, grpo_groups):
    """One of the four group requests is corrupted: its rows carry no score and are flagged."""
    mgr = faulty_manager(load_manager, fault_proxy, verl_config, tokenizer, fault, 1, max_retries=0, failure_policy="mask")
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    out = mgr(data, return_dict=True)
    valid = torch.tensor(out["reward_extra_info"]["rm_valid"]).bool()
    assert int((~valid).sum()) == 4 and mgr.failed == 4
    assert len(set(data.non_tensor_batch["uid"][(~valid).numpy()])) == 1  # exactly one whole group
    assert torch.count_nonzero(out["reward_tensor"][~valid]) == 0  # no number the server did not give
    assert torch.count_nonzero(out["reward_tensor"][valid]) == 12
    assert torch.allclose(last_token_rewards(out["reward_tensor"], data)[valid], reference(hf_model, grpo_groups)[valid], atol=1e-4)


def wait_until(condition, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_failed_step_leaves_no_request_behind(load_manager, fault_proxy, verl_config, tokenizer, grpo_groups, attempts):
    """The first group's 4xx fails the step; the groups queued behind it are cancelled, not sent later.

    One request at a time, four groups: the refused request is the first attempt. The slot it frees
    wakes the next queued group before the failure reaches the step, so that one attempt starts too and
    is cancelled; the two others never start. Afterwards nothing is left on the manager's loop, and
    once the client's connections are closed the proxy has received no more than those attempts."""
    started = attempts
    fault_proxy.faults.fail_status, fault_proxy.faults.fail_times = 400, 1
    mgr = load_manager(verl_config(fault_proxy.url, max_batch_seqs=4, max_length=512,
                                          max_concurrent_requests=1, **FAST), tokenizer)
    with pytest.raises(RewardServerError, match="HTTP 400"):
        mgr(build_batch(grpo_groups, tokenizer.pad_token_id))
    assert len(started) == 2, started
    assert mgr.rm.batcher.in_flight == 0
    assert [t for t in asyncio.all_tasks(mgr.loop) if not t.done()] == []  # nothing can send later
    mgr.close()  # the client's connections end: whatever the proxy was sent has arrived
    wait_until(lambda: fault_proxy.open_connections() == 0, what="the proxy to see the connections close")
    assert 1 <= len(fault_proxy.requests) <= len(started)
    mgr.loop.run_until_complete(asyncio.sleep(0))  # the loop runs again, as at the next step
    assert len(started) == 2 and mgr.rm.batcher.in_flight == 0


def test_failed_length_probe_is_asked_again(load_manager, fault_proxy, verl_config, tokenizer, hf_model, grpo_groups):
    """A /health failure at the first step must not break every later step of the run."""
    fault_proxy.faults.fail_status, fault_proxy.faults.fail_times = 503, 1
    mgr = load_manager(verl_config(fault_proxy.url, max_retries=0), tokenizer)
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    with pytest.raises(RewardServerError, match=r"GET /health.*HTTP 503"):
        mgr(data)
    out = mgr(data, return_dict=True)  # the server answers again: the next step scores
    assert torch.allclose(last_token_rewards(out["reward_tensor"], data), reference(hf_model, grpo_groups), atol=1e-4)
