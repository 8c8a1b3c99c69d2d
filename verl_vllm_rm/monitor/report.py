"""``verl-vllm-rm report RUN_DIR``: what a person looks at after a run, from what the run wrote.

Reads verl's metrics file (``trainer.logger`` with ``file``: one ``{"step", "data"}`` line per
step) and its rollout dump (``trainer.rollout_data_dir``: ``<step>.jsonl``), renders one PNG
(reward components over steps; RM health; each alarm against its threshold) and a short
text summary. The PNG carries the series it plots (text chunk ``vllm_rm_series``), so what it
shows can be checked against the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from verl_vllm_rm.extra_info import RM_SCORE
from verl_vllm_rm.monitor.alarms import run_alarms

SERIES_KEY = "vllm_rm_series"
LATENCY = ("reward/rm_latency_ms/p50", "reward/rm_latency_ms/p99")
SKIPPED_COMPONENTS = ("rm_valid_share", "rm_failures", "rm_tokens", "rm_prompt_tokens_dropped",
                      "rm_latency_ms", "rm_weight_version")


class ReportError(ValueError):
    """The run directory lacks what the report reads; the message says what to set."""


def read_metrics(path: Path) -> list[tuple[int, dict]]:
    """verl's file-logger lines ``(step, metrics)`` (a partly written last line is left out)."""
    path = Path(path)
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            break
        lines.append((int(entry["step"]), entry["data"]))
    return lines


def read_dump(rollout_dir: Path, step: int) -> list[dict]:
    path = Path(rollout_dir) / f"{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Run:
    steps: list[int]
    metrics: dict[int, dict]  # training steps only
    rollout_dir: Path | None

    def series(self, name: str) -> list[float | None]:
        return [self.metrics[s].get(name) for s in self.steps]

    def metric_names(self) -> set[str]:
        return {name for m in self.metrics.values() for name in m}

    def components(self) -> list[str]:
        names = {k[len("reward/"):-len("/mean")] for m in self.metrics.values() for k in m
                 if k.startswith("reward/") and k.endswith("/mean")}
        return sorted(n for n in names if not n.startswith(SKIPPED_COMPONENTS))


def find_run(run_dir: Path) -> Run:
    """The metrics file (``metrics.jsonl``, else the one ``*.jsonl`` under RUN_DIR in verl's file-logger format)
    and the rollout dump (``rollouts/``, else RUN_DIR itself, when it holds ``<step>.jsonl``)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a directory")
    candidates = [run_dir / "metrics.jsonl"] if (run_dir / "metrics.jsonl").exists() else [
        p for p in sorted(run_dir.rglob("*.jsonl")) if not re.fullmatch(r"\d+\.jsonl", p.name) and _is_metrics(p)]
    if len(candidates) != 1:
        found = "none" if not candidates else ", ".join(map(str, candidates))
        raise ReportError(f"{run_dir}: need exactly one verl metrics file (found {found}); run with "
                          "trainer.logger=[console,file] and VERL_FILE_LOGGER_PATH=RUN_DIR/metrics.jsonl")
    metrics = {step: m for step, m in read_metrics(candidates[0]) if "training/global_step" in m}
    if not any(k.startswith("reward/") for m in metrics.values() for k in m):
        raise ReportError(f"{candidates[0]} has no reward/* metrics: run with trainer.v1.trainer_mode=vllm_rm")
    rollout_dir = next((d for d in (run_dir / "rollouts", run_dir) if any(d.glob("[0-9]*.jsonl"))), None)
    return Run(sorted(metrics), metrics, rollout_dir)


def _is_metrics(path: Path) -> bool:
    with open(path) as f:
        first = f.readline()
    try:
        entry = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(entry, dict) and set(entry) == {"step", "data"}


def plotted_series(run: Run) -> dict[str, dict[str, list]]:
    """What the PNG plots, panel by panel: ``{panel: {series name: values per step}}`` (and ``steps``)."""
    panels = {"reward components (mean)": {c: run.series(f"reward/{c}/mean") for c in run.components()},
              "RM latency (ms)": {n: run.series(n) for n in LATENCY},
              "RM valid share": {"reward/rm_valid_share": run.series("reward/rm_valid_share")}}
    for alarm in run_alarms(run.metric_names()):
        values = run.series(alarm.metric)
        if any(v is not None for v in values):
            panels[alarm.metric] = {alarm.metric: values, "threshold": [alarm.threshold] * len(run.steps)}
    return {"steps": run.steps, "panels": panels}


def render_png(run: Run, path: Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    data = plotted_series(run)
    panels = data["panels"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.4 * len(panels)), sharex=True, squeeze=False)
    for ax, (title, series) in zip(axes[:, 0], panels.items()):
        ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)  # 20 distinct colours: components run past 10
        for name, values in series.items():
            points = [(s, v) for s, v in zip(run.steps, values) if v is not None]
            if points:
                style = dict(linestyle="--", color="red") if name == "threshold" else dict(marker="o")
                ax.plot(*zip(*points), label=name, **style)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: never over a line
    axes[-1, 0].set_xlabel("PPO step")
    axes[-1, 0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={SERIES_KEY: json.dumps(data)})
    plt.close(fig)
    return data


def replica_lines(run: Run) -> list[str]:
    """One line per managed RM: replicas healthy at the last step, and evictions, re-syncs, restarts over the run
    (``replicas/<rm>/*``: :func:`verl_vllm_rm.replicas.metrics.replica_step_metrics`)."""
    last = run.metrics[run.steps[-1]]
    rms = sorted({k.split("/")[1] for m in run.metrics.values() for k in m
                  if k.startswith("replicas/") and k.endswith("/evictions") and k.count("/") == 2})
    lines = []
    for rm in rms:
        size = len({k for k in last if k.startswith(f"replicas/{rm}/") and k.endswith("/healthy")
                    and k.count("/") == 3})

        def total(key: str) -> float:
            return sum(m.get(f"replicas/{rm}/{key}", 0.0) for m in run.metrics.values())

        lines.append(f"replicas of {rm}: {last.get(f'replicas/{rm}/healthy', 0.0):.0f} of {size} healthy at step "
                     f"{run.steps[-1]}; over the run {total('evictions'):.0f} evictions from routing, "
                     f"{total('resyncs'):.0f} re-syncs, {total('restarts'):.0f} restarts")
    return lines


def summary_text(run: Run) -> str:
    """The short text: steps, each component first -> last, RM health, every alarm that tripped and when,
    and the last step's best-scored and longest responses (from the rollout dump)."""
    first, last = run.steps[0], run.steps[-1]
    lines = [f"{len(run.steps)} training steps ({first}..{last})", "reward components (mean, first -> last step):"]
    for c in run.components():
        a, b = run.metrics[first].get(f"reward/{c}/mean"), run.metrics[last].get(f"reward/{c}/mean")
        lines.append(f"  {c:<24} {_fmt(a)} -> {_fmt(b)}")
    failures = sum(m.get("reward/rm_failures", 0.0) for m in run.metrics.values())
    p99 = [v for v in run.series("reward/rm_latency_ms/p99") if v is not None]
    versions = [int(v) for v in run.series("reward/rm_weight_version/max") if v is not None]
    lines.append(f"RM: {failures:.0f} failed scores; latency p99 {max(p99):.1f} ms in the worst step" if p99 else
                 f"RM: {failures:.0f} failed scores")
    failed_over = sum(m.get("reward/rm_failed_over", 0.0) for m in run.metrics.values())
    if failed_over:
        lines.append(f"RM: {failed_over:.0f} scores answered by another server after the first one failed or hung")
    lines += replica_lines(run)
    if versions:
        lines.append(f"RM weight version {versions[0]} at step {first} -> {versions[-1]} at step {last}")
    trained = [(step, v, pairs) for step, v, pairs in zip(run.steps, run.series("rm/trained"), run.series("rm/pairs"))
               if v is not None]
    if trained:
        idle = [step for step, v, _ in trained if not v]
        lines.append("online RM, pairs per step: " + ", ".join(f"{step}: {pairs:.0f}" for step, _, pairs in trained)
                     + (f"; no RM step (no preference pairs) after steps {idle}" if idle else
                        "; the RM trained after every step"))
    behind = [(step, v) for step, v in zip(run.steps, run.series("rm/publish_left_behind")) if v]
    if behind:
        lines.append("online RM publishes left servers behind (no request until the next publish re-synced them): "
                     + ", ".join(f"{v:.0f} at step {step}" for step, v in behind))
    drift = [v for v in run.series("drift/mean_abs_change") if v is not None]
    if drift:
        lines.append(f"online RM drift on the probe set (mean |change| from the initial RM): {drift[0]:.4f} after "
                     f"step {first} -> {drift[-1]:.4f} after step {last}")
    tripped = False
    for alarm in run_alarms(run.metric_names()):
        steps = [(s, v) for s, v in zip(run.steps, run.series(alarm.metric)) if v is not None and alarm.tripped(v)]
        if steps:
            tripped = True
            at = ", ".join(f"{s} ({v:.2f})" for s, v in steps)
            lines.append(f"ALARM {alarm.metric} ({alarm.meaning}; threshold {alarm.threshold}) at steps {at}: "
                         f"{alarm.advice}")
    if not tripped:
        lines.append("no alarm tripped")
    rows = read_dump(run.rollout_dir, last) if run.rollout_dir else []
    scored = [r for r in rows if r.get(RM_SCORE) is not None]
    if scored:
        best = max(scored, key=lambda r: r[RM_SCORE])
        longest = max(scored, key=lambda r: r.get("response_length") or len(r["output"]))
        lines.append(f"step {last} best RM score {best[RM_SCORE]:+.3f}: {best['output'][:160]!r}")
        lines.append(f"step {last} longest response (RM score {longest[RM_SCORE]:+.3f}): {longest['output'][:160]!r}")
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f}"


def write_report(run_dir: Path, out: Path | None = None) -> tuple[Path, str]:
    """Render ``report.png`` (into ``out``, default RUN_DIR) and return it with the summary text (also
    written beside it as ``report.txt``)."""
    run = find_run(run_dir)
    out = Path(out or run_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = out / "report.png"
    render_png(run, png)
    text = summary_text(run)
    (out / "report.txt").write_text(text + "\n")
    return png, text
