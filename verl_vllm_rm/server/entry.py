"""``python -m verl_vllm_rm.server``: vLLM's API server with the reward routes.

We run vLLM's own server (``run_server``) unchanged and hook exactly one seam,
``build_app``, to add our routes and API-key guard. Every vLLM flag therefore
keeps working; we only change a few defaults (pooling runner, loopback host,
port 8001, a bounded KV cache on CPU) and, before the engine loads, refuse
weight updates on a non-loopback address without an API key (``exposure``).

With ``--runner generate`` it serves a generative judge instead of a reward model:
vLLM's own ``/v1/chat/completions`` answers the judge's prompts, and structured
output defaults to xgrammar without free whitespace (a small judge otherwise pads
its JSON with whitespace until ``max_tokens`` and the answer never parses).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import signal
import threading
import time

import vllm.entrypoints.launchers.api_server.entry as vllm_entry
from vllm import envs
from vllm.platforms import current_platform

from verl_vllm_rm.server import auth
from verl_vllm_rm.server.exposure import OPT_OUT_FLAG, check_exposure
from verl_vllm_rm.server.model_path import check_model_path
from verl_vllm_rm.server.reward_head import (add_reward_head_args, configure_reward_head, local_architectures,
                                             reward_token, served_shape, step_tag)
from verl_vllm_rm.server.engine_watch import DEFAULT_ENGINE_STALL_TIMEOUT_S, EngineWatch
from verl_vllm_rm.server.runtime_dir import private_tmpdir
from verl_vllm_rm.server.score import serving
from verl_vllm_rm.server.score.router import install_reward_routes
from verl_vllm_rm.server.state import RewardServerState
from verl_vllm_rm.server.weights.state import DEFAULT_JOIN_TIMEOUT_S, DEFAULT_STALL_TIMEOUT_S
from verl_vllm_rm.protocol.defaults import DEFAULT_HOST, DEFAULT_PORT, PARENT_PID_ENV
from verl_vllm_rm.server.lifeline import mark_server_process
from verl_vllm_rm.protocol.names import DEFAULT_HEAD_PATTERNS


WORKER_EXTENSION = "verl_vllm_rm.server.weights.worker_extension.WeightSyncWorkerExtension"
CPU_KV_CACHE_BYTES = 2 << 30
logger = logging.getLogger("verl_vllm_rm.server")


def build_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="verl-vllm-rm reward-model server"))
    group = parser.add_argument_group("verl-vllm-rm")
    add_reward_head_args(group)
    group.add_argument(
        "--max-score-batch", type=int, default=4096, help="Most inputs accepted in one /score request (else 413)."
    )
    group.add_argument(
        "--max-request-bytes", type=int, default=64 << 20, help="Largest accepted request body (else 413)."
    )
    group.add_argument(
        "--engine-stall-timeout", type=float, default=DEFAULT_ENGINE_STALL_TIMEOUT_S, metavar="SECONDS",
        help="A reward model's engine that answers none of its requests for this long (an idle one: a one-token "
        "probe after half of it, unanswered for the other half) counts as stalled: /health and /score answer "
        "503 naming it until it answers again, so clients fail over and a fleet restarts the replica; 0: off.",
    )
    group.add_argument(
        "--enable-weight-updates", action="store_true",
        help="Accept new weights from a trainer: adds /weight_inventory, /init_communicator, "
        "/update_param_batch and /close_communicator (see docs/weight_sync.md).",
    )
    group.add_argument(
        "--weight-update-backend", choices=["gloo", "nccl"], default=None,
        help="Tensor transport for weight updates (default: nccl on GPU, gloo on CPU).",
    )
    group.add_argument(
        "--weight-update-head-patterns", default=",".join(DEFAULT_HEAD_PATTERNS),
        help="Comma-separated glob patterns naming the head's tensors (training_mode head_only).",
    )
    group.add_argument(
        "--weight-update-max-bytes", type=int, default=None,
        help="Refuse weight updates larger than this many bytes (default: no cap beyond the model's own size).",
    )
    group.add_argument(
        "--weight-update-join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S, metavar="SECONDS",
        help="Most seconds /init_communicator spends joining the trainer's process group (a request's "
        "timeout_s may only shorten it); it answers with an error within this bound plus about a second.",
    )
    group.add_argument(
        "--weight-update-stall-timeout", type=float, default=DEFAULT_STALL_TIMEOUT_S, metavar="SECONDS",
        help="Most seconds any wait of a weight transfer lasts with no progress: a bucket that does not come (the "
        "trainer stopped sending), and a staged update neither committed nor aborted (its trainer is gone). The "
        "update then fails, or the staged one is dropped, the old weights keep serving, and the next publish is "
        "accepted; publishers read it and bound their own waits by it.",
    )
    group.add_argument(
        "--weight-update-lora-bases", choices=["host", "device", "off"], default="host",
        help="Where each worker keeps the base weights of the modules LoRA adapts, so a LoRA publish sends only "
        "the adapters and the server merges them (host or device memory, one copy of those weights in the served "
        "dtype per worker: 14 GB for an 8B model in bf16, copied at the first publish that carries adapters, "
        "so a head_only or full run never holds it); off: LoRA publishes send merged weights.",
    )
    group.add_argument(
        "--weight-update-lora-bases-max-bytes", type=int, default=None, metavar="BYTES",
        help="Most bytes a worker may spend on the LoRA base store; a larger store is not kept and LoRA "
        "publishes send merged weights (default: no cap beyond the free memory).",
    )
    group.add_argument(
        "--weight-update-rollback-max-bytes", type=int, default=None, metavar="BYTES",
        help="Most bytes of host memory a worker keeps in copies of what updates loaded (checkpoint format), "
        "from which a reload that fails half-way is undone (default: no cap, so one copy of the model after a "
        "full update, two while a later full update reloads; on a CPU worker they add to its RSS; 0 keeps "
        "none); a failed reload touching a weight whose copy was not kept leaves the weights lost: /health and "
        "/score answer 503 until a full publish.",
    )
    group.add_argument(
        OPT_OUT_FLAG, action="store_true",
        help="Start with --enable-weight-updates on a non-loopback --host without an API key, which is otherwise "
        "refused: anyone who can reach the port can then replace the reward model. Only on an isolated network.",
    )
    parser.set_defaults(runner="pooling", host=DEFAULT_HOST, port=DEFAULT_PORT)
    return parser


def apply_reward_defaults(args: argparse.Namespace, parser) -> None:
    """Defaults that make a reward server start anywhere, each overridable by its flag."""
    untouched_memory = args.gpu_memory_utilization == parser.get_default("gpu_memory_utilization")
    if (
        current_platform.is_cpu()
        and args.kv_cache_memory_bytes is None
        and untouched_memory
        and not os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    ):
        # vLLM-CPU otherwise reserves 92% of a NUMA node and refuses to start on small machines.
        args.kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
    check_model_path(args.model)
    if not (args.engine_stall_timeout >= 0 and math.isfinite(args.engine_stall_timeout)):
        raise SystemExit(f"verl-vllm-rm: --engine-stall-timeout must be a number of seconds >= 0 (0: off), got "
                         f"{args.engine_stall_timeout}")
    tokens = [k for k in (args.api_key or [envs.VLLM_API_KEY]) if k]
    _check_exposure(args, bool(tokens))
    if tokens:
        args.middleware = [*args.middleware, auth.enable(tokens)]
    if args.runner == "generate":
        _judge_defaults(args, parser)
    if args.enable_weight_updates:
        _enable_weight_updates(args)
    if args.runner != "generate":
        configure_reward_head(args)


#: the architectures of a reward model's head, which vLLM's generate runner cannot load as a judge
REWARD_HEADS = ("ForSequenceClassification", "ForTokenClassification", "RewardModel")


def _judge_defaults(args: argparse.Namespace, parser) -> None:
    """A judge (``--runner generate``): a model that generates, no RM-only flag, and answers constrained without
    free whitespace."""
    architectures = local_architectures(args.model)
    if architectures and all(a.endswith(REWARD_HEADS) for a in architectures):
        # vLLM would load it as a causal LM and fail on the head's weights ("no module or parameter named 'score'")
        raise SystemExit(f"verl-vllm-rm: {args.model}: {architectures[0]} is a reward model, which does not "
                         "generate: a judge (--runner generate) needs a causal LM (*ForCausalLM); serve this model "
                         "as a reward model (without --runner generate)")
    for flag, given in (("--enable-weight-updates", args.enable_weight_updates),
                        ("--step-tag-id", args.step_tag_id is not None),
                        ("--step-tag", args.step_tag is not None),
                        ("--step-tokens", args.step_tokens is not None),
                        ("--reward-head", args.reward_head != "auto"),
                        ("--engine-stall-timeout", args.engine_stall_timeout != DEFAULT_ENGINE_STALL_TIMEOUT_S)):
        if given:
            raise SystemExit(f"verl-vllm-rm: {flag} is for a reward model (--runner pooling); a generative judge "
                             f"(--runner generate) takes no {flag}: drop one of the two")
    default = parser.get_default("structured_outputs_config")
    if args.structured_outputs_config == default:
        args.structured_outputs_config = dataclasses.replace(default, backend="xgrammar", disable_any_whitespace=True)
    elif not args.structured_outputs_config.disable_any_whitespace:
        logger.warning("judge: --structured-outputs-config without disable_any_whitespace: a small judge may pad "
                       "its JSON answer with whitespace until max_tokens, and an answer that does not parse fails")


def _check_exposure(args: argparse.Namespace, has_api_key: bool) -> None:
    """Protected mode (server/exposure.py): refuse, or warn, before the engine loads."""
    warnings = check_exposure(
        host=args.host, port=args.port, uds=args.uds, has_api_key=has_api_key,
        weight_updates=args.enable_weight_updates,
        opt_out=args.dangerously_allow_unauthenticated_weight_updates,
    )
    for warning in warnings:
        logger.warning(warning)


def _enable_weight_updates(args: argparse.Namespace) -> None:
    """Load our worker extension (it registers the transfer engines) and select the engine."""
    if args.weight_transfer_config is not None:
        raise SystemExit("verl-vllm-rm: --enable-weight-updates sets the weight-transfer engine itself; "
                         "drop --weight-transfer-config and choose the transport with --weight-update-backend")
    if args.worker_extension_cls and args.worker_extension_cls != WORKER_EXTENSION:
        raise SystemExit(f"verl-vllm-rm: --enable-weight-updates needs --worker-extension-cls {WORKER_EXTENSION}, "
                         f"got {args.worker_extension_cls}: drop --worker-extension-cls (the server sets it)")
    if args.weight_update_lora_bases_max_bytes is not None and args.weight_update_lora_bases_max_bytes < 0:
        raise SystemExit(f"verl-vllm-rm: --weight-update-lora-bases-max-bytes must be a number of bytes >= 0, "
                         f"got {args.weight_update_lora_bases_max_bytes}")
    if args.weight_update_rollback_max_bytes is not None and args.weight_update_rollback_max_bytes < 0:
        raise SystemExit(f"verl-vllm-rm: --weight-update-rollback-max-bytes must be a number of bytes >= 0, "
                         f"got {args.weight_update_rollback_max_bytes}")
    if not (0 < args.weight_update_join_timeout and math.isfinite(args.weight_update_join_timeout)):
        raise SystemExit(f"verl-vllm-rm: --weight-update-join-timeout must be a positive number of seconds, "
                         f"got {args.weight_update_join_timeout}")
    if not (0 < args.weight_update_stall_timeout and math.isfinite(args.weight_update_stall_timeout)):
        raise SystemExit(f"verl-vllm-rm: --weight-update-stall-timeout must be a positive number of seconds, "
                         f"got {args.weight_update_stall_timeout}")
    if getattr(args, "data_parallel_size", 1) > 1:
        raise SystemExit(f"verl-vllm-rm: --enable-weight-updates with --data-parallel-size "
                         f"{args.data_parallel_size}: each data-parallel engine would need a transfer group of its "
                         "own, and an update would reach one of them; run that many servers instead, as managed "
                         "replicas (reward_kwargs.replicas) or behind the client's server_url list, and publish "
                         "to all of them (MultiServerPublisher)")
    if args.weight_update_backend is None:
        args.weight_update_backend = "gloo" if current_platform.is_cpu() else "nccl"
    args.worker_extension_cls = WORKER_EXTENSION
    args.weight_transfer_config = {"backend": "gloo" if args.weight_update_backend == "gloo" else "torch_nccl"}


def _reward_state(args: argparse.Namespace, model_config, shape) -> RewardServerState:
    return RewardServerState(
        kind="judge" if args.runner == "generate" else "reward_model",
        shape=shape,
        served_models=list(args.served_model_name or [args.model]),
        max_model_len=model_config.max_model_len,
        vocab_size=model_config.get_vocab_size(),
        world_size=args.tensor_parallel_size * args.pipeline_parallel_size,
        step_tag=None if args.runner == "generate" else step_tag(args),
        reward_token=None if args.runner == "generate" else reward_token(args, model_config),
        max_score_batch=args.max_score_batch,
        max_request_bytes=args.max_request_bytes,
    )


def _engine_watch(app, timeout_s: float, shape) -> EngineWatch:
    """The watch of this server's engine (``app.state.engine_client`` is set after ``build_app``: read per probe)."""
    weights = app.state.reward.weights

    def updating() -> bool:
        return weights.update_task is not None and not weights.update_task.done()

    return EngineWatch(timeout_s, lambda: serving.probe(app.state.engine_client, shape), updating)


def _hooked_build_app(original):
    def build_app(args, supported_tasks=None, model_config=None):
        judge = args.runner == "generate"
        shape = None if judge else served_shape(args, supported_tasks, model_config)
        app = original(args, supported_tasks, model_config)
        install_reward_routes(app)
        app.state.reward = _reward_state(args, model_config, shape)
        if not judge and args.engine_stall_timeout > 0:
            app.state.reward.engine_watch = _engine_watch(app, args.engine_stall_timeout, shape)
        if args.enable_weight_updates:
            from verl_vllm_rm.server.weights.router import install_weight_routes

            patterns = tuple(p.strip() for p in args.weight_update_head_patterns.split(",") if p.strip())
            install_weight_routes(app, args.weight_update_backend, patterns, args.weight_update_max_bytes,
                                  args.weight_update_join_timeout, args.weight_update_lora_bases,
                                  args.weight_update_lora_bases_max_bytes, args.weight_update_rollback_max_bytes,
                                  args.weight_update_stall_timeout)
        return app

    return build_app


def _exit_with_parent() -> None:
    """When started by a test or the demo, do not outlive the process that started us."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return

    def watch(pid: int) -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os.killpg(os.getpgrp(), signal.SIGTERM)
                return
            time.sleep(1.0)

    threading.Thread(target=watch, args=(int(parent),), daemon=True, name="exit-with-parent").start()


def main(argv: list[str] | None = None) -> None:
    import uvloop
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_reward_defaults(args, parser)
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    _exit_with_parent()
    mark_server_process()
    vllm_entry.build_app = _hooked_build_app(vllm_entry.build_app)
    with private_tmpdir():
        uvloop.run(vllm_entry.run_server(args))
