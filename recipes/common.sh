#!/usr/bin/env bash
# Shared helpers for the recipes: start the reward server in its own environment
# and wait for it, stop it on exit. Source this file; do not run it.
#
#   VERL_VLLM_RM_SERVER_PYTHON  python of the server environment (vllm and verl-vllm-rm installed)
#               default: .venv-server/bin/python of this clone (`make setup`, or `make setup DEVICE=gpu`)
#   The trainer runs with the python3 on PATH: activate the trainer environment (.venv of this clone, or
#   verl's environment with verl-vllm-rm installed) first.
#   RM_PATH     the reward model (a *ForSequenceClassification checkpoint)
#   RM_PORT     default 8001;  RM_GPUS  CUDA_VISIBLE_DEVICES for the server
#   RM_ARGS     extra vLLM engine flags, e.g. "--tensor-parallel-size 2"
#   TRAIN_GPUS  CUDA_VISIBLE_DEVICES of the verl run; default: the visible GPUs minus RM_GPUS, so
#               Ray never places a policy (or RM-trainer) worker on the reward server's GPU
#   RM_SERVER_URL  use this running reward server instead of starting one
#   VERL_VLLM_RM_CPU_PROFILE=1  the same recipe on a machine without a GPU: tiny sizes, 2 steps
#               (VERL_VLLM_RM_CPU_STEPS=N for N), verl's
#               main_ppo made to run on CPU by verl_vllm_rm.dev.cpu_harness (MODEL, DATA and RM_PATH
#               must then be tiny: `make test` runs every recipe this way; one that another execs, inside that one)

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SERVER_PYTHON=${VERL_VLLM_RM_SERVER_PYTHON:-$REPO_ROOT/.venv-server/bin/python}
RM_PORT=${RM_PORT:-8001}
RM_URL=${RM_SERVER_URL:-${RM_URL:-http://127.0.0.1:${RM_PORT}}}

# Exits naming the environment and the fix when NAME's python lacks one of the modules.
require_env() {
    local name=$1 python=$2 fix=$3; shift 3
    if ! command -v "$python" > /dev/null; then
        echo "no $name environment: $python does not exist; $fix" >&2; exit 2
    fi
    local missing
    missing=$("$python" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@")
    if [[ -n "$missing" ]]; then echo "the $name environment ($python) lacks: $missing; $fix" >&2; exit 2; fi
}

start_reward_server() {
    if [[ -n "${RM_SERVER_URL:-}" ]]; then echo "using the reward server at ${RM_SERVER_URL}"; return 0; fi
    [[ -n "${RM_PATH:-}" ]] || { echo "set RM_PATH to the reward model" >&2; exit 2; }
    require_env server "$SERVER_PYTHON" "set VERL_VLLM_RM_SERVER_PYTHON to the python of an environment with vllm and verl-vllm-rm, or run \`make setup\` (\`make setup DEVICE=gpu\` on GPUs) in $REPO_ROOT" vllm verl_vllm_rm
    CUDA_VISIBLE_DEVICES=${RM_GPUS:-${CUDA_VISIBLE_DEVICES:-}} \
        "$SERVER_PYTHON" -m verl_vllm_rm.server --model "$RM_PATH" --port "$RM_PORT" ${RM_ARGS:-} "$@" \
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
    require_env trainer python3 "activate the trainer environment first (source $REPO_ROOT/.venv/bin/activate after \`make setup\`, or verl's environment with this package installed: see docs/quickstart.md)" verl verl_vllm_rm
    start_reward_server ${RM_SERVER_FLAGS:-}
    local gpus
    gpus=$(train_gpus)
    if [[ -n "$gpus" ]]; then export CUDA_VISIBLE_DEVICES=$gpus; echo "verl runs on GPUs $gpus"; fi
    local profile=()
    if [[ "${VERL_VLLM_RM_CPU_PROFILE:-0}" == 1 ]]; then
        export VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.dev.cpu_harness.activate${VERL_USE_EXTERNAL_MODULES:+,$VERL_USE_EXTERNAL_MODULES}
        mapfile -t profile < <(python3 -m verl_vllm_rm.dev.cpu_profile "${VERL_VLLM_RM_CPU_STEPS:-2}" "$@")
        [[ ${#profile[@]} -gt 0 ]] || { echo "could not build the CPU profile" >&2; exit 1; }
    fi
    python3 -m verl.trainer.main_ppo "$@" "${profile[@]}"
}

# The GPUs verl may use: TRAIN_GPUS, or the visible ones (CUDA_VISIBLE_DEVICES, else every
# GPU nvidia-smi lists) except RM_GPUS. Ray does not know the server holds RM_GPUS and would
# otherwise place workers there. Prints nothing when there is nothing to restrict.
train_gpus() {
    if [[ -n "${TRAIN_GPUS:-}" ]]; then echo "$TRAIN_GPUS"; return; fi
    [[ -n "${RM_GPUS:-}" ]] || return 0
    local visible=${CUDA_VISIBLE_DEVICES:-}
    if [[ -z "$visible" ]] && command -v nvidia-smi > /dev/null; then
        visible=$(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ' | paste -sd, -)
    fi
    [[ -n "$visible" ]] || return 0
    local gpu kept=()
    for gpu in ${visible//,/ }; do
        [[ ",$RM_GPUS," == *",$gpu,"* ]] || kept+=("$gpu")
    done
    (IFS=,; echo "${kept[*]}")
}
