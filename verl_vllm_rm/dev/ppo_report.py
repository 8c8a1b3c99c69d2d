"""What a tiny-ppo run produced: verl's metrics file and rollout dump (read with :mod:`verl_vllm_rm.monitor.report`)
turned into ``summary.json``, and the tables printed while and after it runs."""

from __future__ import annotations

from pathlib import Path

from verl_vllm_rm.monitor import report

VAL_SECTIONS = ("val-core/", "val-aux/")  # verl's validation metrics: <section>/<data_source>/<key>/<stat>


def read_metrics(work_dir: Path) -> list[tuple[int, dict]]:
    """verl's file-logger lines ``(step, metrics)`` of a tiny-ppo work dir, so far."""
    return report.read_metrics(Path(work_dir) / "metrics.jsonl")


def read_dump(work_dir: Path, step: int) -> list[dict]:
    """verl's rollout dump of ``step`` in a tiny-ppo work dir (``rollouts/``)."""
    return report.read_dump(Path(work_dir) / "rollouts", step)


def summarize(work_dir: Path, online: str, versions: dict[int, int | None]) -> dict:
    """``summary.json``'s content: one entry per step, the validation figures, and where things are."""
    metrics = dict(read_metrics(work_dir))
    steps = []
    for step in sorted(versions):
        m = metrics.get(step, {})
        steps.append({
            "step": step,
            "reward_mean": m.get("critic/rewards/mean"),
            "rm_score_mean": m.get("reward/rm_score/mean"),  # the reward metrics of trainer mode vllm_rm
            "verifiable_mean": m.get("reward/verifiable_score/mean"),
            "form_mean": m.get("reward/format/mean"),
            "rm_version": versions[step],
            "parity_max_abs": m.get("rm/parity_max_abs_diff") if online != "off" else None,
            # online RM: whether the RM trained after this step, on how many preference pairs
            "rm_trained": bool(m["rm/trained"]) if online != "off" and "rm/trained" in m else None,
            "rm_pairs": int(m["rm/pairs"]) if online != "off" and "rm/pairs" in m else None,
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
        "plot": str(work_dir / "report.png"),  # verl-vllm-rm report's
        "report": str(work_dir / "report.txt"),
    }


def print_step(step: int, metrics: dict, version: int | None) -> None:
    parity = metrics.get("rm/parity_max_abs_diff")
    extra = f"  parity max|server-trainer|={parity:.1e}" if parity is not None else ""
    if "rm/trained" in metrics:
        extra += (f"  RM trained on {metrics['rm/pairs']:.0f} pairs" if metrics["rm/trained"] else
                  f"  RM idle: no preference pairs ({metrics['rm/idle_steps']:.0f} step(s) in a row)")
    print(f"step {step:>3}: reward {metrics.get('critic/rewards/mean', float('nan')):+.3f}  "
          f"rm_version {version}  {metrics.get('timing_s/step', float('nan')):.1f} s{extra}", flush=True)


def print_summary(summary: dict) -> None:
    def fmt(v, spec):
        return format(v, spec) if v is not None else "-"

    def trained(s: dict) -> str:
        return "-" if s["rm_trained"] is None else f"{s['rm_pairs']} pairs" if s["rm_trained"] else "idle"

    print(f"\n{'step':>4} {'reward':>8} {'rm score':>9} {'form':>6} {'correct':>8} {'rm_version':>10} {'parity':>9} "
          f"{'rm step':>10}")
    for s in summary["steps"]:
        print(f"{s['step']:>4} {fmt(s['reward_mean'], '+8.3f')} {fmt(s['rm_score_mean'], '+9.3f')} "
              f"{fmt(s['form_mean'], '6.2f')} {fmt(s['verifiable_mean'], '8.2f')} {fmt(s['rm_version'], '>10')} "
              f"{fmt(s['parity_max_abs'], '9.1e')} {trained(s):>10}")
    for step, figures in sorted(summary["validation"].items()):
        wins = {k.rsplit("/", 2)[-2]: v for k, v in figures.items() if k.endswith(("/win/mean@1", "/win_and/mean@1"))}
        print(f"validation at step {step}: " + ", ".join(f"{k}={v:.2f}" for k, v in sorted(wins.items())))
    print(f"\nsummary: {Path(summary['plot']).parent / 'summary.json'}\nreport: {summary['plot']}, "
          f"{summary['report']}\nrollout dump: {summary['rollout_data_dir']}")
