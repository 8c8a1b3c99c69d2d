"""One PNG comparing our paths with the baselines, from the JSON in benchmarks/results/.

    .venv/bin/python benchmarks/plot_results.py   # -> benchmarks/results/summary.png
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _grpo(ax, report) -> None:
    paths = [("a_vllm_rm", "vllm_rm batch call (a)"), ("e_vllm_rm_per_row", "vllm_rm per row, verl's loop (e)"),
             ("b_verl_builtin_classify", "verl built-in /classify (b)"), ("c_one_batched_request", "one request (c)")]
    labels = []
    for r in report["results"]:
        sh = r["shape"]
        labels.append(f"{sh['prompts']}x{sh['responses_per_prompt']}\n{sh['prompt_tokens']}/{sh['response_tokens']} tok")
    width = 0.8 / len(paths)
    for k, (key, name) in enumerate(paths):
        values = [r["seq_per_s"][key] for r in report["results"]]
        ax.bar([i + (k - (len(paths) - 1) / 2) * width for i in range(len(labels))], values, width=width, label=name)
    ax.set_xticks(list(range(len(labels))), labels)
    ax.set_ylabel("sequences / s")
    ax.set_title("GRPO batch scoring (same server)")
    ax.legend(fontsize=7)


def _rules(ax, report) -> None:
    names = list(report["speedup"])
    ax.bar([n for n in names], [report["seconds"]["rm_gallery"][n] for n in names], label="rm-gallery")
    ax.bar([n for n in names], [report["seconds"]["ours"][n] for n in names], label="ours")
    ax.set_yscale("log")
    ax.set_ylabel("seconds (4,096 x 1,000 tokens)")
    ax.set_title(f"rule rewards: {report['total']['speedup']:.0f}x faster")
    ax.legend(fontsize=7)


def _sync(ax, report) -> None:
    rows = report["results"]
    labels = [f"{r['model']}\n{r['mode']}" for r in rows]
    ax.bar([i - 0.2 for i in range(len(rows))], [r["publish_s"] for r in rows], width=0.4, label="publish")
    ax.bar([i + 0.2 for i in range(len(rows))], [r["raw_broadcast_s"] for r in rows], width=0.4,
           label="raw broadcast, same bytes")
    ax.set_xticks(range(len(rows)), labels)
    ax.set_yscale("log")
    ax.set_ylabel("seconds")
    ax.set_title("weight publish (gloo, CPU)")
    ax.legend(fontsize=7)


def main() -> Path:
    panels = [(name, fn, _load(name)) for name, fn in
              [("grpo_scoring", _grpo), ("rule_rewards", _rules), ("weight_sync", _sync)]]
    panels = [(name, fn, data) for name, fn, data in panels if data is not None]
    if not panels:
        raise SystemExit("no results in benchmarks/results/: run `verl-vllm-rm bench` first")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2))
    for ax, (_, fn, data) in zip(axes if len(panels) > 1 else [axes], panels):
        fn(ax, data)
    fig.tight_layout()
    out = RESULTS / "summary.png"
    fig.savefig(out, dpi=110)
    print(out)
    return out


if __name__ == "__main__":
    main()
