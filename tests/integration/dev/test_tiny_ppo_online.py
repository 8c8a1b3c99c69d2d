"""Trainer mode ``vllm_rm_online`` in verl's real ``main_ppo``, the RM on two replicas the plugin starts and
manages on verl's Ray cluster: one RM step per PPO step, published to both replicas and parity-probed; one replica's
engine stopped (SIGSTOP) for a step, its API server answering on, and resumed: step 2's requests that met it fail
over to the other, the run carries on with the other and re-syncs it; RM state and the RM's whitening statistics
in verl's checkpoints and a resumed run (whose fresh replicas get the restored RM before its first score); an
unreachable reward server (one killed mid-run: test_tiny_ppo.py); replicas that cannot start. (A fixed list of two
servers, one frozen for a step, left behind by the publish and re-synced by the next,
``online_rm.on_server_failure=leave_behind``: the separate_async run of test_tiny_ppo_any_rm.py.)"""

from __future__ import annotations

import json
import os
import re
import signal

import numpy as np
import psutil
import pytest
import torch
from ppo_runs import expected_totals, generations, tiny_ppo
from process_helpers import engine_core_pid

from verl_vllm_rm.dev.ppo_report import read_dump, read_metrics
from verl_vllm_rm.dev.tiny_ppo import SERVER_ARGS, TinyPPOConfig, TinyPPOError, run_tiny_ppo

pytestmark = [pytest.mark.server, pytest.mark.ray]

RM_RANKS = 2  # the RM trains sharded over two ranks of verl's engine (FSDP2)
FIRST_STEPS = 4  # one replica's engine is stopped after step 1 and resumed after step 2
#: the replicas' --engine-stall-timeout: a stopped engine is declared stalled (its /health 503, out of the fleet's
#: routing) this long after its last answer, which must come after step 2's first requests reached it
ENGINE_STALL_S = 40
RESUMED = FIRST_STEPS + 1  # the step the resumed run trains


def replica_servers(model: str) -> dict[int, int]:
    """The managed replicas of ``model`` now running, by port: servers of that model whose parent is a
    ServerReplica actor (Ray titles an actor's process ``ray::ServerReplica``). Only this run's: the other xdist
    worker's fleet tests serve models of their own."""
    found = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if ("verl_vllm_rm.server" in cmd and "ServerReplica" in " ".join(proc.parent().cmdline())
                    and os.path.realpath(cmd[cmd.index("--model") + 1]) == os.path.realpath(model)):
                found[int(cmd[cmd.index("--port") + 1])] = proc.pid
        except (psutil.Error, ValueError, IndexError):
            continue
    return found


class StopOneReplicasEngine:
    """``on_step``: after step 1, SIGSTOP one replica's engine-core process (its API server answers on, ``/health``
    included, until the engine watch declares the stall); after step 2, SIGCONT it.

    A wholly frozen replica (API server too) leaves the fleet's routing within ~6 s (its ``/health`` goes
    unanswered), before step 2's rollout has anything to score, so no request need meet it. A stopped engine keeps
    the replica in routing until ``ENGINE_STALL_S`` after its last answer: step 2's requests reach it and wait
    there, and fail over once its ``/health`` turns 503."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.pid: int | None = None

    def __call__(self, step: int, metrics: dict, version: int | None) -> None:
        if step == 1:
            servers = replica_servers(self.model)
            assert len(servers) == 2, servers
            self.pid = engine_core_pid(servers[min(servers)])
            os.kill(self.pid, signal.SIGSTOP)
        elif step == 2:
            self.resume()

    def resume(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)
            self.pid = None


@pytest.fixture(scope="module")
def online_runs(tmp_path_factory, tiny_rm, tiny_task):
    """FIRST_STEPS online steps (a checkpoint each; one replica's engine stopped during step 2), then the same run
    resumed to one more step; each run starts its own two replicas (weight version 0); the RM's scores are whitened
    (running statistics, two reward-loop workers). Clients look at a replica's /health after 2 s without an answer
    (2 s to answer) and fail over once it is not ok; the fleet restarts one unhealthy for 600 s only, so the stopped
    one is resumed, not restarted."""
    work = tmp_path_factory.mktemp("ppo_online")
    args = ",".join(f"'{a}'" for a in [*SERVER_ARGS, "--enable-weight-updates",
                                       "--engine-stall-timeout", str(ENGINE_STALL_S)])
    common = dict(online="full", validate=False, replicas=2,
                  extra_overrides=["trainer.save_freq=1", "+reward.reward_kwargs.whiten=running",
                                   "reward.num_workers=2", f"+online_rm.num_workers={RM_RANKS}",
                                   "+reward.reward_kwargs.failover_after_s=2",
                                   "+reward.reward_kwargs.health_timeout_s=2",
                                   "+reward.reward_kwargs.replicas.hung_restart_s=600",
                                   f"++reward.reward_kwargs.replicas.server_args=[{args}]"])
    stop = StopOneReplicasEngine(str(tiny_rm))
    try:
        first = tiny_ppo(work, tiny_rm, tiny_task["policy"], None, steps=FIRST_STEPS, on_step=stop, **common)
    finally:
        stop.resume()
    first["metrics"] = dict(read_metrics(work))  # the resumed run writes its own metrics file and report
    first["report"] = (work / "report.txt").read_text()
    resumed = tiny_ppo(work, tiny_rm, tiny_task["policy"], None, steps=RESUMED, **common)
    resumed["metrics"] = dict(read_metrics(work))
    return work, first, resumed


def replica_metrics(metrics: dict, replica: int) -> dict[str, float]:
    prefix = f"replicas/rm/{replica}/"
    return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix)}


def test_every_step_trains_publishes_and_matches_the_trainer_with_a_replica_stopped_for_a_step(online_runs):
    """Step 1 publishes to both replicas (two-phase). One replica's engine is then stopped: step 2's requests that
    reach it wait there and fail over (``reward/rm_failed_over`` > 0) once its engine watch declares the stall, so
    all step-2 rewards come from the one that answers (rm_valid 1 for every sample); the fleet takes the stopped one
    out of routing, and step 2 publishes to the live one alone. Resumed during step 3, it is behind: out of routing
    (every step-3 reward is version 2), and step 3's publish re-syncs it (to both again); in step 4 it serves again,
    on version 3. Versions rise every step; parity holds on every replica published to. Replica metrics are read
    before the step's RM update."""
    _, first, _ = online_runs
    metrics = first["metrics"]
    assert [s["rm_version"] for s in first["steps"]] == [1, 2, 3, 4]
    for s in first["steps"]:
        assert s["parity_max_abs"] is not None and s["parity_max_abs"] <= 1e-4, s
    assert [metrics[step]["rm/publish_servers"] for step in (1, 2, 3, 4)] == [2, 1, 2, 2]
    for i in (0, 1):
        m = replica_metrics(metrics[1], i)
        assert m["routed"] == 1.0 and m["version"] == 0 and m["failures"] == 0.0, m
    assert metrics[2]["reward/rm_failed_over"] > 0, "no step-2 request met the stopped replica"
    stopped = [i for i in (0, 1) if replica_metrics(metrics[2], i)["healthy"] == 0.0]
    assert len(stopped) == 1, [replica_metrics(metrics[2], i) for i in (0, 1)]
    stopped, live = stopped[0], 1 - stopped[0]
    # out of routing at least once since step 1 (a loaded machine may add a /health missed by a busy replica)
    assert replica_metrics(metrics[2], stopped)["evictions"] >= 1.0 and metrics[2]["replicas/rm/healthy"] == 1.0
    assert replica_metrics(metrics[2], live)["routed"] == 1.0
    behind = replica_metrics(metrics[3], stopped)  # its engine resumed, the replica not restarted
    assert (behind["healthy"], behind["routed"], behind["version"], behind["restarts"]) == (1.0, 0.0, 1.0, 0.0)
    resynced = replica_metrics(metrics[4], stopped)
    assert (resynced["routed"], resynced["version"], resynced["resyncs"]) == (1.0, 3.0, 1.0), resynced
    assert resynced["inputs"] > 0  # it takes traffic again
    assert re.search(r"replicas of rm: 2 of 2 healthy at step 4; over the run [1-9]\d* evictions from routing, "
                     r"1 re-syncs, 0 restarts", first["report"]), first["report"]


def test_each_rm_rank_holds_half_of_the_rms_training_state(online_runs, tiny_rm):
    """``full`` on 2 ranks of verl's engine: per step, each rank's parameters + gradients + Adam's moments (fp32,
    16 bytes a parameter: what one rank holds alone) are half of the RM's, read from the engine's own shards."""
    from transformers import AutoModelForSequenceClassification

    whole = 16 * sum(p.numel() for p in AutoModelForSequenceClassification.from_pretrained(tiny_rm).parameters())
    _, first, _ = online_runs
    for step in range(1, FIRST_STEPS + 1):
        m = first["metrics"][step]
        assert m["rm/ranks"] == RM_RANKS and m["rm/state_bytes_all_ranks"] == pytest.approx(whole, rel=0.01)
        assert m["rm/state_bytes"] == pytest.approx(whole / RM_RANKS, rel=0.01)


def test_online_steps_log_reward_metrics_the_weight_version_and_drift(online_runs):
    """vllm_rm_online has trainer mode vllm_rm's metrics; step N's rollouts were all scored (by an answering
    replica: one's engine was stopped in step 2) with the weights published after step N-1; the RM's drift on the
    probe set is measured every step and moves once the RM has trained."""
    _, first, _ = online_runs
    metrics = first["metrics"]
    for step in range(1, FIRST_STEPS + 1):
        m = metrics[step]
        assert m["reward/rm_valid_share"] == 1.0 and "reward/rm_score/mean" in m and "alarm/dead_groups" in m
        assert m["reward/rm_weight_version/min"] == m["reward/rm_weight_version/max"] == step - 1
        assert m["drift/mean_abs_change"] >= 0 and -1.0 <= m["alarm/drift_rank_corr"] <= 1.0
    assert max(metrics[s]["drift/mean_abs_change"] for s in range(1, FIRST_STEPS + 1)) > 0


def rm_at(folder) -> tuple[torch.nn.Module, int]:
    """The RM of verl's checkpoint of the RM engine in ``folder`` (joined from its ranks' shards), and the RM
    steps it had taken."""
    from verl_vllm_rm.online.export import load_trained_rm, rm_run_state

    state = rm_run_state(folder)
    assert (state["world_size"], state["training_mode"]) == (RM_RANKS, "full")
    return load_trained_rm(folder), state["steps"]


def test_rm_state_is_in_verls_checkpoint_and_the_resumed_replicas_score_with_it(online_runs, tiny_rm):
    """The resumed run's replicas are new (version 0): the trainer starts them at set-up and publishes the RM
    restored from global_step_4 to both before anything is scored, so every step-5 RM score is that RM's score of
    the exact tokens verl generated; step 5 then publishes again, with parity."""
    from transformers import AutoTokenizer

    from verl_vllm_rm.parity.reference import sequence_scores

    work, _, resumed = online_runs
    for step in range(1, RESUMED + 1):
        folder = work / "checkpoints" / f"global_step_{step}" / "online_rm"
        assert [(folder / f"model_world_size_{RM_RANKS}_rank_{r}.pt").is_file() for r in range(RM_RANKS)] == [True] * 2
    assert [s["step"] for s in resumed["steps"]] == [RESUMED]  # verl resumed from global_step_4
    assert resumed["steps"][0]["rm_version"] == 2  # the resume published 1, step 5 published 2
    assert resumed["steps"][0]["parity_max_abs"] <= 1e-4
    for i in (0, 1):
        m = replica_metrics(resumed["metrics"][RESUMED], i)
        assert m["routed"] == 1.0 and m["version"] == 1.0 and m["restarts"] == 0.0, m
    restored, steps = rm_at(work / "checkpoints" / f"global_step_{FIRST_STEPS}" / "online_rm")
    assert steps == FIRST_STEPS and rm_at(work / "checkpoints" / f"global_step_{RESUMED}" / "online_rm")[1] == RESUMED
    tokenizer = AutoTokenizer.from_pretrained(resumed["policy"])
    dump = read_dump(work, RESUMED)
    rows = expected_totals(dump, generations(work), tokenizer, lambda seqs: sequence_scores(restored, seqs))
    assert len(rows) == 16
    for row, candidates, _ in rows:
        assert min(abs(row["rm_score_rm"] - c) for c in candidates) <= 1e-4, (row["rm_score_rm"], candidates)


def test_whitening_statistics_are_saved_with_the_rm_and_continue_in_the_resumed_run(online_runs):
    """Each checkpoint's whitening.json (beside the RM's state) holds the running statistics of every raw RM
    score of the run so far, merged over both reward-loop workers; the resumed run's workers started from step 4's
    file, so step 5's counts every score of steps 1-5 once."""
    work = online_runs[0]
    raw = {step: [row["rm_score_rm"] for row in read_dump(work, step)] for step in range(1, RESUMED + 1)}
    for step in range(1, RESUMED + 1):
        path = work / "checkpoints" / f"global_step_{step}" / "online_rm" / "whitening.json"
        saved = json.loads(path.read_text())["reward_models"]["rm"]
        seen = np.array([x for s in range(1, step + 1) for x in raw[s]], dtype=float)
        assert saved["count"] == len(seen) == 16 * step
        assert saved["mean"] == pytest.approx(seen.mean(), abs=1e-6)
        assert saved["m2"] == pytest.approx(((seen - seen.mean()) ** 2).sum(), rel=1e-6)
    # the whitened score is what the ensemble (here: the one RM) used
    row = read_dump(work, RESUMED)[0]
    assert row["rm_score"] == pytest.approx(row["rm_scaled_rm"])


def test_unreachable_server_stops_the_run_naming_it(tmp_path, tiny_rm, tiny_task, dead_url):
    """No retry can help: main_ppo stops with the plugin's error naming the server before verl builds a worker
    (plugin/server_check.py), and no step trained."""
    cfg = TinyPPOConfig(tmp_path / "dead", steps=2, rm=tiny_rm, policy=str(tiny_task["policy"]),
                        server_url=dead_url, validate=False,
                        extra_overrides=["+reward.reward_kwargs.max_retries=1",
                                         "+reward.reward_kwargs.deadline_s=5"])
    with pytest.raises(TinyPPOError) as err:
        run_tiny_ppo(cfg, on_step=None)
    assert "main_ppo exited with code" in str(err.value)
    log = (cfg.work_dir / "main_ppo.log").read_text(errors="replace")
    assert ("RewardServerError: no reward server answers /health, checked before verl builds its workers: reward "
            f"model 'rm' (reward_kwargs.server_url=['{dead_url}']): GET /health failed after 2 attempt(s)") in log
    assert "actor and ref model engine initialized" not in log  # verl's set-up never began
    assert not [step for step, m in read_metrics(cfg.work_dir) if "training/global_step" in m]


def test_replicas_that_cannot_start_stop_the_run_at_set_up_with_the_engines_error(tmp_path, tiny_rm, tiny_task):
    """Both replicas' model path is wrong: main_ppo stops at set-up (no step) with the fleet's error, which carries
    each replica's own last lines (the server's refusal of the path)."""
    missing = tmp_path / "no-such-rm"
    cfg = TinyPPOConfig(tmp_path / "bad", steps=1, rm=tiny_rm, policy=str(tiny_task["policy"]), replicas=2,
                        validate=False, extra_overrides=[f"++reward.reward_kwargs.replicas.model={missing}"])
    with pytest.raises(TinyPPOError) as err:
        run_tiny_ppo(cfg, on_step=None)
    log = (cfg.work_dir / "main_ppo.log").read_text(errors="replace")
    assert "FleetError: 2 of 2 replicas of vllm_rm_replicas_rm did not start, and replicas.min_healthy=2" in log, \
        str(err.value)
    assert ("fix the cause the replica's own lines give, or set replicas.min_healthy lower to run on the replicas "
            "that start") in log
    assert "replica 0: ServerStartError: server exited with code 1" in log
    assert f"verl-vllm-rm: --model {missing} does not exist" in log  # the server's own words, from its log
    assert not [step for step, m in read_metrics(cfg.work_dir) if "training/global_step" in m]
