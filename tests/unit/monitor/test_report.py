"""``verl-vllm-rm report`` on what a run leaves: refusals that say what to set, and the PNG's own record of what
it plots. The report of a real main_ppo run: ``tests/integration/dev/test_tiny_ppo.py::test_report_of_the_run``."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from verl_vllm_rm.cli import main
from verl_vllm_rm.monitor.report import SERIES_KEY, ReportError, find_run, write_report


def write_run(run_dir, steps=3, with_reward=True):
    lines = [{"step": 0, "data": {"val-core/x/acc/mean@1": 0.5}}]  # val_before_train: no training metrics
    for s in range(1, steps + 1):
        data = {"training/global_step": s, "critic/rewards/mean": 0.1 * s}
        if with_reward:
            data.update({"reward/score/mean": 0.5 * s, "reward/rm_score/mean": -1.0 + s,
                         "reward/rm_valid_share": 1.0, "reward/rm_latency_ms/p50": 12.0,
                         "reward/rm_latency_ms/p99": 40.0 + s, "reward/rm_failures": 0.0,
                         "reward/rm_weight_version/max": float(s), "alarm/dead_groups": 0.2 * s,
                         "drift/mean_abs_change": 0.01 * s})
        lines.append({"step": s, "data": data})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run_dir / "rollouts").mkdir(exist_ok=True)
    rows = [{"input": "q", "output": "a" * n, "score": n, "rm_score": float(n), "response_length": n}
            for n in (3, 9, 5)]
    (run_dir / "rollouts" / f"{steps}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_the_png_records_what_it_plots_and_the_text_names_the_tripped_alarm(tmp_path):
    png, text = write_report(write_run(tmp_path / "run"))
    image = Image.open(png)
    assert image.format == "PNG" and image.size[0] > 400
    series = json.loads(image.text[SERIES_KEY])
    assert series["steps"] == [1, 2, 3]
    assert series["panels"]["reward components (mean)"] == {"rm_score": [0.0, 1.0, 2.0], "score": [0.5, 1.0, 1.5]}
    assert series["panels"]["alarm/dead_groups"]["threshold"] == [0.5] * 3
    assert "ALARM alarm/dead_groups" in text and "at steps 3 (0.60)" in text
    assert "drift on the probe set (mean |change| from the initial RM): 0.0100 after step 1 -> 0.0300" in text
    assert "latency p99 43.0 ms in the worst step" in text and "RM weight version 1 at step 1 -> 3 at step 3" in text
    assert "best RM score +9.000: 'aaaaaaaaa'" in text
    assert (tmp_path / "run" / "report.txt").read_text().strip() == text


def test_a_watched_attribute_pair_is_plotted_and_named_when_it_trips(tmp_path):
    run = write_run(tmp_path / "run")
    metric = "alarm/attribute_rise/rm/verbosity_over_helpfulness"
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for line, value in zip(lines[1:], (0.0, 0.4, 1.5)):
        line["data"][metric] = value
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    png, text = write_report(run)
    assert json.loads(Image.open(png).text[SERIES_KEY])["panels"][metric] == {metric: [0.0, 0.4, 1.5],
                                                                              "threshold": [1.0] * 3}
    assert f"ALARM {metric} (how far the watched attribute's step mean rose" in text and "at steps 3 (1.50)" in text


def test_the_report_says_per_step_whether_the_online_rm_trained_and_on_how_many_pairs(tmp_path):
    run = write_run(tmp_path / "run")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for entry, (trained, pairs) in zip(lines[1:], [(1.0, 4.0), (0.0, 0.0), (1.0, 3.0)]):
        entry["data"].update({"rm/trained": trained, "rm/pairs": pairs})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, text = write_report(run)
    assert "online RM, pairs per step: 1: 4, 2: 0, 3: 3; no RM step (no preference pairs) after steps [2]" in text
    _, plain = write_report(write_run(tmp_path / "offline"))
    assert "pairs per step" not in plain


def test_the_report_names_the_steps_whose_publish_left_a_server_behind(tmp_path):
    run = write_run(tmp_path / "run")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for entry, behind in zip(lines[1:], [0.0, 1.0, 0.0]):
        entry["data"]["rm/publish_left_behind"] = behind
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, text = write_report(run)
    assert ("online RM publishes left servers behind (no request until the next publish re-synced them): "
            "1 at step 2") in text
    _, plain = write_report(write_run(tmp_path / "plain"))
    assert "left servers behind" not in plain


def test_the_report_counts_each_fleets_evictions_resyncs_restarts_and_the_failed_over_scores(tmp_path):
    run = write_run(tmp_path / "run")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for entry, (healthy, evictions, resyncs, failed_over) in zip(lines[1:], [(2, 0, 0, 0), (1, 1, 0, 6), (2, 0, 1, 0)]):
        entry["data"].update({"replicas/rm/healthy": float(healthy), "replicas/rm/evictions": float(evictions),
                              "replicas/rm/resyncs": float(resyncs), "replicas/rm/restarts": 0.0,
                              "replicas/rm/0/healthy": 1.0, "replicas/rm/1/healthy": float(healthy - 1),
                              "reward/rm_failed_over": float(failed_over)})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, text = write_report(run)
    assert ("replicas of rm: 2 of 2 healthy at step 3; over the run 1 evictions from routing, 1 re-syncs, "
            "0 restarts") in text
    assert "RM: 6 scores answered by another server after the first one failed or hung" in text
    _, plain = write_report(write_run(tmp_path / "plain"))
    assert "replicas of" not in plain and "another server" not in plain


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "missing", "is not a directory"),
    (lambda d: d, r"need exactly one verl metrics file \(found none\)"),
    (lambda d: write_run(d, with_reward=False), "no reward/\\* metrics: run with trainer.v1.trainer_mode=vllm_rm"),
])
def test_what_the_report_cannot_read_is_named(tmp_path, make, message):
    with pytest.raises(ReportError, match=message):
        find_run(make(tmp_path))


def test_cli_report_exit_codes(tmp_path, capsys):
    assert main(["report", str(write_run(tmp_path / "run")), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "report.png").is_file() and "3 training steps" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
