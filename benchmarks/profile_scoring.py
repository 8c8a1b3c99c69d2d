"""Profile the manager's own cost per sample with pyinstrument (installed beside the venv, see below).

Both paths of ``bench_grpo_scoring`` against the zero-compute ``/score`` fixture (a
benchmark fixture: the server costs nothing, so every sampled frame is the trainer
side's): the batch ``__call__`` and verl's ``RewardLoopWorker.compute_score_batch``
calling ``run_single`` once per row. Prints pyinstrument's call tree of each path and
shape (frames under ``--min-percent`` hidden) and writes it to
``benchmarks/results/profile_<path>_<shape>.txt`` with ``--save``.

    .venv/bin/pip install --target /tmp/pyinstrument-deps pyinstrument
    PYTHONPATH=/tmp/pyinstrument-deps .venv/bin/python benchmarks/profile_scoring.py --batches 10

pyinstrument stays out of ``.venv``: ``make test`` checks that the venv holds exactly the pinned set.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent))


def profile_path(path: str, url: str, model: str, batches: list, min_percent: float) -> str:
    from pyinstrument import Profiler
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_vllm_rm.dev.loader import vllm_rm_config

    worker = RewardLoopWorker(vllm_rm_config(url, model, {"num_examine": 0}))
    mgr = worker.reward_manager
    if path == "batch_call":

        def run(batch) -> None:
            mgr(batch)
    else:

        def run(batch) -> None:
            worker.loop.run_until_complete(worker.compute_score_batch(batch))

    try:
        worker.loop.run_until_complete(mgr.warm_up())
        run(batches[0])  # warm-up: connections, first-call imports
        gc.collect()  # as the benchmark does before each timed path: no collection of the set-up's garbage inside
        profiler = Profiler(interval=0.0002, async_mode="disabled")
        with profiler:
            for batch in batches[1:]:
                run(batch)
        samples = sum(len(b) for b in batches[1:])
        header = f"{path}: {samples} samples, {1e3 * profiler.last_session.duration / samples:.4f} ms/sample\n"
        return header + profiler.output_text(unicode=False, color=False, show_all=False, short_mode=False,
                                             time="seconds", flat=False, processor_options={
                                                 "filter_threshold": min_percent / 100.0})
    finally:
        mgr.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=10, help="GRPO batches (32 x 8) profiled per path and shape")
    parser.add_argument("--min-percent", type=float, default=1.0, help="hide frames below this share of the time")
    parser.add_argument("--save", action="store_true", help="also write benchmarks/results/profile_*.txt")
    args = parser.parse_args(argv)
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        sys.exit("profile_scoring.py needs pyinstrument, kept out of .venv (make test checks its pinned set): "
                 ".venv/bin/pip install --target /tmp/pyinstrument-deps pyinstrument, then run with "
                 "PYTHONPATH=/tmp/pyinstrument-deps")
    import numpy as np
    from transformers import AutoTokenizer

    from bench_grpo_scoring import make_groups
    from verl_vllm_rm.dev.grpo_batch import build_batch
    from verl_vllm_rm.dev.tiny_rm import build_tiny_rm
    from zero_compute_server import zero_compute_server

    model = str(build_tiny_rm(Path(tempfile.gettempdir()) / "verl-vllm-rm-bench-tiny-rm"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    rng = np.random.default_rng(0)
    with zero_compute_server() as url:
        for shape in [(32, 8, 300, 60), (32, 8, 100, 300)]:
            batches = [build_batch(make_groups(tokenizer, rng, *shape), tokenizer.pad_token_id)
                       for _ in range(args.batches + 1)]
            for path in ("batch_call", "per_row"):
                text = profile_path(path, url, model, batches, args.min_percent)
                print(f"===== shape {shape[2]}/{shape[3]} tokens =====\n{text}")
                if args.save:
                    (RESULTS / f"profile_{path}_{shape[2]}_{shape[3]}.txt").write_text(text)


if __name__ == "__main__":
    main()
