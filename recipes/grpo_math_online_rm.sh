#!/usr/bin/env bash
# GRPO on GSM8K with a reward model that keeps learning during the run.
#
# Each PPO step scores rollouts with the served RM (blended with verl's gsm8k
# correctness), then one Bradley-Terry step trains the RM on preference pairs from
# that same batch (per prompt group: the best vs the worst response by the
# verifiable reward), and the new RM weights are pushed into the running server
# (every PUBLISH_EVERY RM steps). Needs verl's v1 trainer deps (verl[verl-core]).
#
#   RM_PATH=/models/my-rm RM_GPUS=7 \
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct DATA=$HOME/data/gsm8k bash recipes/grpo_math_online_rm.sh
#
# GPUs: N_GPUS for the policy, RM_GPUS for the reward server, RM_TRAIN_GPUS (1) for
# the RM trainer: verl's FSDP engine (as for its critic) sharded over that many ranks, bf16
# compute with fp32 masters. RM_MODE: head_only | lora | full. A full 8B RM needs 4 ranks
# (2 with +online_rm.optimizer_offload=True); +online_rm.placement=colocated puts one RM rank
# beside each actor rank instead (benchmarks/README.md, "Online RM training on GPUs").
set -euo pipefail
RM_MODE=${RM_MODE:-lora}
PUBLISH_EVERY=${PUBLISH_EVERY:-1}
export N_GPUS=${N_GPUS:-6}
export RM_SERVER_FLAGS="--enable-weight-updates ${RM_SERVER_FLAGS:-}"
# Trainer mode vllm_rm_online is registered by the package's verl.plugins entry point: no other setting.

# The weighted math recipe, plus the online RM trainer (later overrides win); the RM trainer publishes
# into the reward manager's server (online_rm.server_url defaults to reward.reward_kwargs.server_url).
exec bash "$(dirname "$0")/grpo_math_rm_weighted.sh" \
    trainer.use_v1=True \
    trainer.v1.trainer_mode=vllm_rm_online \
    +online_rm.model_path="${RM_PATH:-}" \
    +online_rm.training_mode="$RM_MODE" \
    +online_rm.publish_every="$PUBLISH_EVERY" \
    +online_rm.reward_key=verifiable_score \
    +online_rm.lr=1e-5 \
    +online_rm.num_workers="${RM_TRAIN_GPUS:-1}" \
    trainer.experiment_name=grpo_gsm8k_online_rm \
    "$@"
