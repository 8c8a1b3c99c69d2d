"""``tiny-ppo``'s summary and step lines (``dev/ppo_report.py``) from a run's metrics file: with online RM training,
each step says whether the RM trained after it and on how many preference pairs."""

from __future__ import annotations

import json

from verl_vllm_rm.dev.ppo_report import print_step, print_summary, summarize


def test_each_step_says_whether_the_rm_trained_and_on_how_many_pairs(tmp_path, capsys):
    steps = {1: {"rm/trained": 1.0, "rm/pairs": 4.0, "rm/idle_steps": 0.0},
             2: {"rm/trained": 0.0, "rm/pairs": 0.0, "rm/idle_steps": 1.0}}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {"training/global_step": s, **m}})
                                                    + "\n" for s, m in steps.items()))
    summary = summarize(tmp_path, "lora", {1: 1, 2: 1})
    assert [(s["rm_trained"], s["rm_pairs"]) for s in summary["steps"]] == [(True, 4), (False, 0)]
    assert [s["rm_trained"] for s in summarize(tmp_path, "off", {1: None})["steps"]] == [None]
    print_step(1, steps[1], 1)
    print_step(2, steps[2], 1)
    print_summary(summary)
    out = capsys.readouterr().out
    assert "RM trained on 4 pairs" in out and "RM idle: no preference pairs (1 step(s) in a row)" in out
    rows = [line.split() for line in out.splitlines() if line[:4].strip() in ("1", "2")]
    assert rows[-2][-2:] == ["4", "pairs"] and rows[-1][-1] == "idle"
