"""What a tiny-ppo run produced: verl's metrics file and rollout dump, read back into ``summary.json``,
a PNG of reward per step, and the tables printed while and after it runs."""

from __future__ import annotations

import json
from pathlib import Path

VAL_SECTIONS = ("val-core/", "val-aux/")  # verl's validation metrics: <section>/<data_source>/<key>/<stat>


def read_metrics(work_dir: Path) -> list[tuple[int, dict]]:
    """verl's file-logger lines ``(step, metrics)`` so far (a partly written last line is left for later)."""
    path = Path(work_dir) / "metrics.jsonl"
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


def read_dump(work_dir: Path, step: int) -> list[dict]:
    path = Path(work_dir) / "rollouts" / f"{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _mean(values: list) -> float | None:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize(work_dir: Path, online: str, versions: dict[int, int | None]) -> dict:
    """``summary.json``'s content: one entry per step, the validation figures, and where things are."""
    metrics = dict(read_metrics(work_dir))
    steps = []
    for step in sorted(versions):
        m = metrics.get(step, {})
        dump = read_dump(work_dir, step)
        steps.append({
            "step": step,
            "reward_mean": m.get("critic/rewards/mean"),
            "rm_score_mean": _mean([row.get("rm_score") for row in dump]),
            "verifiable_mean": _mean([row.get("verifiable_score") for row in dump]),
            "form_mean": _mean([row.get("format") for row in dump]),
            "rm_version": versions[step],
            "parity_max_abs": m.get("rm/parity_max_abs_diff") if online != "off" else None,
            "step_s": m.get("timing_s/step"),
        })
    validation = {step: {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith(VAL_SECTIONS)}
                  for step, m in metrics.items() if any(k.startswith(VAL_SECTIONS) for k in m)}
    return {
        "online": online,
        "steps": steps,
        "validation": validation,
        "rollout_data_dir": str(work_dir / "rollouts"),
        "metrics_file": str(work_dir / "metrics.jsonl"),
        "main_ppo_log": str(work_dir / "main_ppo.log"),
        "plot": str(work_dir / "reward_per_step.png"),
    }


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s["step"] for s in summary["steps"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, label in (("reward_mean", "reward (what GRPO trained on)"), ("rm_score_mean", "RM score"),
                       ("form_mean", "answer form"), ("verifiable_mean", "gsm8k correctness")):
        values = [s[key] for s in summary["steps"]]
        if any(v is not None for v in values):
            ax.plot(steps, values, marker="o", label=label)
    ax.set_xlabel("PPO step")
    ax.set_ylabel("mean per sample")
    ax.set_title(f"main_ppo GRPO with vllm_rm (online RM: {summary['online']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def print_step(step: int, metrics: dict, version: int | None) -> None:
    parity = metrics.get("rm/parity_max_abs_diff")
    extra = f"  parity max|server-trainer|={parity:.1e}" if parity is not None else ""
    print(f"step {step:>3}: reward {metrics.get('critic/rewards/mean', float('nan')):+.3f}  "
          f"rm_version {version}  {metrics.get('timing_s/step', float('nan')):.1f} s{extra}", flush=True)


def print_summary(summary: dict) -> None:
    def fmt(v, spec):
        return format(v, spec) if v is not None else "-"

    print(f"\n{'step':>4} {'reward':>8} {'rm score':>9} {'form':>6} {'correct':>8} {'rm_version':>10} {'parity':>9}")
    for s in summary["steps"]:
        print(f"{s['step']:>4} {fmt(s['reward_mean'], '+8.3f')} {fmt(s['rm_score_mean'], '+9.3f')} "
              f"{fmt(s['form_mean'], '6.2f')} {fmt(s['verifiable_mean'], '8.2f')} {fmt(s['rm_version'], '>10')} "
              f"{fmt(s['parity_max_abs'], '9.1e')}")
    for step, figures in sorted(summary["validation"].items()):
        wins = {k.rsplit("/", 2)[-2]: v for k, v in figures.items() if k.endswith(("/win/mean@1", "/win_and/mean@1"))}
        print(f"validation at step {step}: " + ", ".join(f"{k}={v:.2f}" for k, v in sorted(wins.items())))
    print(f"\nsummary: {Path(summary['plot']).parent / 'summary.json'}\nplot: {summary['plot']}\n"
          f"rollout dump: {summary['rollout_data_dir']}")
