#!/usr/bin/env bash
# Shared helpers for the recipes: start the reward server in its own environment
# and wait for it, stop it on exit. Source this file; do not run it.
#
#   RM_PYTHON   python of the server environment (vllm installed)   default: python
#   RM_PATH     the reward model (a *ForSequenceClassification checkpoint)
#   RM_PORT     default 8001;  RM_GPUS  CUDA_VISIBLE_DEVICES for the server
#   RM_ARGS     extra vLLM engine flags, e.g. "--tensor-parallel-size 2"

RM_PYTHON=${RM_PYTHON:-python}
RM_PORT=${RM_PORT:-8001}
RM_URL=${RM_URL:-http://127.0.0.1:${RM_PORT}}

start_reward_server() {
    [[ -n "${RM_PATH:-}" ]] || { echo "set RM_PATH to the reward model" >&2; exit 2; }
    CUDA_VISIBLE_DEVICES=${RM_GPUS:-${CUDA_VISIBLE_DEVICES:-}} \
        "$RM_PYTHON" -m verl_vllm_rm.server --model "$RM_PATH" --port "$RM_PORT" ${RM_ARGS:-} "$@" \
        > "${RM_LOG:-reward_server.log}" 2>&1 &
    RM_PID=$!
    trap 'kill "$RM_PID" 2>/dev/null; wait "$RM_PID" 2>/dev/null' EXIT
    for _ in $(seq 1 600); do
        if curl -sf "${RM_URL}/health" > /dev/null; then echo "reward server ready at ${RM_URL}"; return 0; fi
        kill -0 "$RM_PID" 2>/dev/null || { echo "reward server exited; see ${RM_LOG:-reward_server.log}" >&2; exit 1; }
        sleep 1
    done
    echo "reward server not ready after 600 s" >&2; exit 1
}

# VERL_VLLM_RM_DRY_RUN=1 prints the trainer overrides (one per line) instead of
# running; tests compose them with verl's own config.
run_main_ppo() {
    if [[ "${VERL_VLLM_RM_DRY_RUN:-0}" == 1 ]]; then printf '%s\n' "$@"; exit 0; fi
    start_reward_server ${RM_SERVER_FLAGS:-}
    python3 -m verl.trainer.main_ppo "$@"
}
