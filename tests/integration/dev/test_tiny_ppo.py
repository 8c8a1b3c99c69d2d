"""``vllm_rm`` inside verl's real ``main_ppo`` in its ``separate_async`` mode (GRPO on CPU through the harness,
trainer mode ``vllm_rm_separate_async``: generation runs ahead of training on a standalone rollout replica, synced
after every step over the harness's ``cpu_gloo`` checkpoint engine; the real vLLM server): the rewards verl trained
on are the server's scores of the exact token ids it generated, also across the server's SIGKILL and restart in the
middle of the run (a request meets the dead server and is retried), composed with the rules and a generative judge
(each member ranked as the judge's own answer ranks its response).

The judge (one run for both, as a run costs minutes): every reward holds half the listwise judge's score of
the response within its group, judged once per group across verl's two reward-loop workers; validation groups
hold ``val_kwargs.n`` = 2 responses, which only works because our trainer modes tag each validation prompt (verl's
per-trajectory reward calls do not say, and here training rollouts run beside validation; a validation group would
otherwise wait for 4 members until ``group_timeout_s`` and fail the run)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
from pathlib import Path

import numpy as np
import pytest
from judge_answers import assert_ranks_are_the_judges
from ppo_runs import ROLLOUT_TOKEN_DELAY_S, check_scored_once_whole, expected_totals, generations, tiny_ppo

from verl_vllm_rm.dev.ppo_report import read_dump, read_metrics
from verl_vllm_rm.client.http import free_port
from verl_vllm_rm.replicas.launcher import start_server


GROUP = 4  # tiny-ppo's responses per prompt in training


JUDGE_WEIGHT = 0.5


MATH_DAPO_EVERY = 2  # half the prompts are math_dapo ones (verl's DAPO scorer), the rest gsm8k


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, tiny_rm, tiny_task, server_args, judge_server) -> dict:
    """vllm_rm in main_ppo: 2 GRPO steps, validation before and after, against a server of this module that is
    SIGKILLed right after step 1 and restarted on its port only once a step-2 request has met the dead port (its
    connection reset); retries cover the restart (~25 s). The restarted server stays up for the module's checks. tiny-ppo's
    composition gains the listwise judge (weight JUDGE_WEIGHT); validation samples 2 responses a prompt. Half the
    prompts are math_dapo ones, and DAPO's group filter runs on ``score`` (verl's ``algorithm.filter_groups``)."""
    from fault_proxy import FaultProxy

    port = free_port()
    servers = [start_server(tiny_rm, server_args, port=port)]
    judge = FaultProxy(judge_server.url).start()  # records what the judge was shown and answered (no fault)
    met_dead: list[str] = []

    def kill_and_restart(step: int, metrics: dict, version: int | None) -> None:
        if step == 1:
            os.killpg(servers[0].process.pid, signal.SIGKILL)
            servers[0].process.wait()
            met_dead.append(reset_first_connection(port))  # the dead port, until a request of step 2 meets it
            servers.append(start_server(tiny_rm, server_args, port=port))

    try:
        run = tiny_ppo(tmp_path_factory.mktemp("ppo_plain"), tiny_rm, tiny_task["policy"], servers[0].url, steps=2,
                       on_step=kill_and_restart, mode="separate_async", rollout_token_delay_s=ROLLOUT_TOKEN_DELAY_S,
                       math_dapo_every=MATH_DAPO_EVERY,
                       extra_overrides=[
                           "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=score",
                           "+reward.reward_kwargs.max_retries=100", "+reward.reward_kwargs.backoff_max_s=2",
                           "++reward.reward_kwargs.rewards.components=[rubric,verifiable,format,judge]",
                           f"++reward.reward_kwargs.rewards.weights.judge={JUDGE_WEIGHT}",
                           f"+reward.reward_kwargs.judge={{server_url:'{judge.url}',mode:listwise,"
                           "group_timeout_s:120}",
                           "actor_rollout_ref.rollout.val_kwargs.n=2",
                           "reward.num_workers=2",  # a judge group's members meet across two workers
                           "actor_rollout_ref.rollout.val_kwargs.do_sample=True"])
        run["servers_started"] = len(servers)
        run["met_dead"] = met_dead
        run["judge_requests"] = judge.requests
        yield run
    finally:
        judge.stop()
        for server in servers:
            server.stop()


@pytest.mark.server
@pytest.mark.ray
def test_separate_async_generates_ahead_on_its_own_replica_synced_every_step(plain_run):
    """The run is verl's separate_async: its standalone rollout replica generated with the policy of step 0, then
    with each step's weights (versions 1 and 2), which reached it through the cpu_gloo checkpoint engine."""
    work = Path(plain_run["rollout_data_dir"]).parent
    command = (work / "main_ppo.cmd").read_text()
    assert "trainer.v1.trainer_mode=vllm_rm_separate_async" in command
    assert "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_gloo" in command
    assert {v for g in generations(work) for v in g["versions"]} >= {0, 1}


@pytest.mark.server
@pytest.mark.ray
def test_a_trajectory_aborted_for_a_weight_sync_and_resumed_is_scored_once_whole(plain_run):
    """verl aborts the generation in flight for each weight sync and resumes it after (partial rollouts): some
    trajectories were generated in segments on two policy versions, and each reward call scored a whole
    trajectory, none twice (verl's reward loop scores after the agent loop returns the merged trajectory)."""
    resumed = check_scored_once_whole(Path(plain_run["rollout_data_dir"]).parent)
    assert resumed, "no trajectory was aborted, resumed and scored: the run made no partial rollout"
    assert any(len(set(t["versions"])) > 1 for t in resumed), [t["versions"] for t in resumed]


def reset_first_connection(port: int, timeout_s: float = 600.0) -> str:
    """Play the dead server on ``port`` until a client connects: that connection is reset (as a server killed
    mid-request leaves it), the port freed for the restart. Returns the peer that met it (fails after
    ``timeout_s`` without one: then no request ever met the dead server)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(16)
        listener.settimeout(timeout_s)
        conn, peer = listener.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        conn.close()
    return f"{peer[0]}:{peer[1]}"


@pytest.mark.server
@pytest.mark.ray
def test_main_ppo_runs_the_steps_and_writes_the_summary(plain_run):
    steps = plain_run["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert s["reward_mean"] is not None and s["rm_score_mean"] is not None
        assert s["rm_version"] == 0 and s["parity_max_abs"] is None  # no online RM training
    work = Path(plain_run["rollout_data_dir"]).parent
    assert json.loads((work / "summary.json").read_text())["steps"] == steps
    assert Path(plain_run["plot"]).stat().st_size > 1000
    assert Path(plain_run["rollout_data_dir"], "2.jsonl").is_file()


@pytest.mark.server
@pytest.mark.ray
def test_rewards_verl_trained_on_equal_direct_scores(plain_run):
    """Every dumped reward = direct /score of the same token ids + gsm8k correctness + FORM_WEIGHT * form +
    JUDGE_WEIGHT * the judge's score, before the server was killed and after its restart (every score valid: the
    retries covered the restart)."""
    from transformers import AutoTokenizer

    work = Path(plain_run["rollout_data_dir"]).parent
    tokenizer = AutoTokenizer.from_pretrained(plain_run["policy"])
    gens = generations(work)
    checked = 0
    for step in (1, 2):
        dump = read_dump(work, step)
        assert len(dump) == 16  # 4 prompts x 4 responses
        for row, rm_candidates, rules in expected_totals(dump, gens, tokenizer, plain_run["server_url"]):
            assert row["rm_valid"] == 1.0
            assert min(abs(row["rm_score"] - c) for c in rm_candidates) <= 1e-4, (row, rm_candidates)
            total = row["rm_score"] + rules + JUDGE_WEIGHT * row["judge_score"]
            assert abs(row["score"] - total) <= 1e-4, row  # the composed total
            checked += 1
    assert checked == 32
    assert plain_run["servers_started"] == 2, "the server was never killed"
    assert len(plain_run["met_dead"]) == 1  # a step-2 request met the dead server, and (rm_valid 1) was retried


@pytest.mark.server
@pytest.mark.ray
def test_validation_reports_pairwise_win_rates(plain_run):
    validation = plain_run["validation"]
    assert set(validation) == {0, 2}
    for figures in validation.values():
        assert {"openai/gsm8k/win/mean@2", "openai/gsm8k/win_and/mean@2"} <= set(figures), sorted(figures)
        win = next(v for k, v in figures.items() if k.endswith("/win/mean@2"))
        win_and = next(v for k, v in figures.items() if k.endswith("/win_and/mean@2"))
        assert 0.0 <= win <= win_and <= 1.0


@pytest.mark.server
@pytest.mark.ray
def test_every_training_reward_holds_the_groups_one_listwise_judgement(plain_run):
    """(Its share of the reward: test_rewards_verl_trained_on_equal_direct_scores.)"""
    work = Path(plain_run["rollout_data_dir"]).parent
    for step in (1, 2):
        dump = read_dump(work, step)
        groups: dict[str, list[dict]] = {}
        for row in dump:
            groups.setdefault(row["group"], []).append(row)
        assert len(dump) == 16 and all(len(g) == GROUP for g in groups.values())
        for members in groups.values():
            assert sorted(m["judge_rank"] for m in members) == [0.0, 1.0, 2.0, 3.0]  # one ranking per group
            # each member's rank is the one the judge's own answer gave its response
            assert_ranks_are_the_judges([(m["output"], m["judge_rank"]) for m in members],
                                        plain_run["judge_requests"])
            for m in members:
                assert m["judge_valid"] == 1.0 and m["rm_valid"] == 1.0
                assert m["judge_score"] == pytest.approx(1 - 2 * m["judge_rank"] / (GROUP - 1))


@pytest.mark.server
@pytest.mark.ray
def test_validation_groups_of_val_kwargs_n_are_judged(plain_run):
    for figures in plain_run["validation"].values():
        valid = [v for k, v in figures.items() if k.endswith("/judge_valid/mean@2")]
        ranks = [v for k, v in figures.items() if k.endswith("/judge_rank/mean@2")]
        assert valid == [1.0, 1.0] and ranks == [0.5, 0.5], sorted(figures)  # per data source; ranks 0 and 1


@pytest.mark.server
@pytest.mark.ray
def test_mixed_data_sources_carry_the_same_keys_and_dapo_reads_score(plain_run):
    """math_dapo and gsm8k prompts in one run (verl's DAPO scorer returns ``{score, acc, pred}``, its gsm8k scorer a
    number) with ``algorithm.filter_groups.metric=score``: verl's replay buffer read ``score`` from every finished
    group's reward_extra_info (it raises for a group without it) and the run trained on both data sources; every
    trained row carries verl's ``acc`` (the dump keeps numeric columns: ``pred``, text, is not in it), and
    validation, where verl assembles the step's columns, reports ``acc`` for both. A math_dapo row is one whose
    ``verifiable_score`` is -1 (ppo_runs.expected_totals). ``metric=acc`` is checked where verl reads it
    (tests/integration/scoring/test_reward_loop_ray.py says why not here)."""
    work = Path(plain_run["rollout_data_dir"]).parent
    sources = set()
    for step in (1, 2):
        for row in read_dump(work, step):
            dapo = row["verifiable_score"] == -1.0
            sources.add("math_dapo" if dapo else "openai/gsm8k")
            assert row["acc"] == (0.0 if dapo else row["verifiable_score"]), row
    assert sources == {"math_dapo", "openai/gsm8k"}
    for figures in plain_run["validation"].values():
        assert {"math_dapo/acc/mean@2", "openai/gsm8k/acc/mean@2"} <= set(figures), sorted(figures)


def recomputed(dump: list[dict]) -> dict[str, float]:
    """The reward metrics of one step, recomputed from verl's rollout dump with plain numpy and loops."""
    valid = [r for r in dump if r["rm_valid"] == 1.0]
    rm = np.array([r["rm_score"] for r in valid])
    out = {"reward/rm_score/mean": rm.mean(), "reward/rm_score/std": rm.std(), "reward/rm_score/max": rm.max(),
           "reward/score/mean": np.mean([r["score"] for r in valid]),
           "reward/format/mean": np.mean([r["format"] for r in dump]),
           "reward/verifiable_score/mean": np.mean([r["verifiable_score"] for r in dump]),
           "reward/win/mean": np.mean([r["win"] for r in dump]),
           "reward/rm_valid_share": len(valid) / len(dump),
           "reward/rm_failures": float(len(dump) - len(valid)),
           "reward/rm_tokens": float(sum(r["rm_tokens"] for r in dump)),
           "reward/rm_prompt_tokens_dropped": float(sum(r["rm_prompt_tokens_dropped"] for r in dump)),
           "reward/rm_latency_ms/p50": np.percentile([r["rm_latency_ms"] for r in dump], 50),
           "reward/rm_weight_version/max": max(r["rm_weight_version"] for r in valid)}
    lengths = np.array([r["response_length"] for r in valid], dtype=float)
    out["alarm/length_hacking"] = np.corrcoef(rm, lengths)[0, 1]
    out["alarm/saturation"] = np.mean(np.abs(rm) > np.log(99))
    groups: dict[str, list[dict]] = {}
    for r in dump:
        groups.setdefault(r["group"], []).append(r)
    out["alarm/dead_groups"] = np.mean([len({r["score"] for r in g}) == 1 for g in groups.values()])
    ordered = [(a, b) for g in groups.values() for a in g for b in g if a["verifiable_score"] > b["verifiable_score"]]
    if len(ordered) >= 4:
        out["alarm/verifiable_disagreement"] = np.mean([b["rm_score"] > a["rm_score"] for a, b in ordered])
    return out


@pytest.mark.server
@pytest.mark.ray
def test_reward_metrics_are_in_verls_logger_every_step_and_match_the_dump(plain_run):
    """Trainer mode vllm_rm: reward/* and alarm/* in verl's metrics file at every step, equal to what the rollout
    dump (one row per trajectory, with its reward components) gives; a warning line exactly for tripped alarms."""
    from verl_vllm_rm.monitor.alarms import ALARMS

    work = Path(plain_run["rollout_data_dir"]).parent
    metrics = dict(read_metrics(work))
    log = (work / "main_ppo.log").read_text(errors="replace")
    for step in (1, 2):
        dump = read_dump(work, step)
        assert len(dump) == 16 and len({r["group"] for r in dump}) == 4
        want = recomputed(dump)
        got = {k: metrics[step].get(k) for k in want}
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9), step
        assert metrics[step]["reward/rm_weight_version/min"] == 0.0 and metrics[step]["timing_s/reward_metrics"] > 0
        for alarm in ALARMS:
            value = metrics[step].get(alarm.metric)
            line = f"vllm_rm alarm at step {step}: {alarm.metric} = "
            assert (line in log) == (value is not None and alarm.tripped(value)), (alarm.metric, value)


@pytest.mark.server
@pytest.mark.ray
def test_report_of_the_run(plain_run, tmp_path):
    """``verl-vllm-rm report`` on the run's work dir: a PNG whose series are the run's metrics, step by step."""
    from PIL import Image

    from verl_vllm_rm.cli import main
    from verl_vllm_rm.monitor.report import SERIES_KEY

    work = Path(plain_run["rollout_data_dir"]).parent
    assert main(["report", str(work), "--out", str(tmp_path)]) == 0
    image = Image.open(tmp_path / "report.png")
    series = json.loads(image.text[SERIES_KEY])
    metrics = dict(read_metrics(work))
    assert series["steps"] == [1, 2]
    components = series["panels"]["reward components (mean)"]
    assert {"rm_score", "score", "format", "verifiable_score", "win"} <= set(components)
    for name, values in components.items():
        assert values == [metrics[s][f"reward/{name}/mean"] for s in (1, 2)], name
    assert series["panels"]["RM valid share"]["reward/rm_valid_share"] == [1.0, 1.0]
    assert series["panels"]["RM latency (ms)"]["reward/rm_latency_ms/p99"] == [
        metrics[s]["reward/rm_latency_ms/p99"] for s in (1, 2)]
    assert series["panels"]["alarm/dead_groups"]["alarm/dead_groups"] == [metrics[s]["alarm/dead_groups"] for s in (1, 2)]
    pixels = np.asarray(image.convert("L"))
    assert image.size[1] > 5 * 200 and (pixels < 128).mean() > 0.005  # one panel per series group, lines drawn
    text = (tmp_path / "report.txt").read_text()
    assert text.startswith("2 training steps (1..2)") and "step 2 best RM score" in text


@pytest.mark.server  # starts the reward server (which refuses the model)
def test_an_rm_the_server_cannot_load_stops_the_run_with_the_servers_words(tmp_path, tiny_task):
    """A config.json that is no model's: the server refuses it before its engine loads, and main_ppo never starts."""
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, TinyPPOError, run_tiny_ppo

    rm = tmp_path / "not-a-model"
    rm.mkdir()
    (rm / "config.json").write_text("{}")
    cfg = TinyPPOConfig(tmp_path / "work", rm=str(rm), policy=str(tiny_task["policy"]))
    with pytest.raises(TinyPPOError, match=rf"the reward server on {rm} did not start: server exited with code 1; "
                                           rf"log tail:(.|\n)*Unrecognized model in {rm}"):
        run_tiny_ppo(cfg, on_step=None)
    assert not (cfg.work_dir / "main_ppo.log").exists()
