#!/usr/bin/env bash
# GRPO on GSM8K with a reward model that keeps learning during the run.
#
# Each PPO step scores rollouts with the served RM (blended with verl's gsm8k
# correctness), then one Bradley-Terry step trains the RM on preference pairs from
# that same batch (per prompt group: the best vs the worst response by the
# verifiable reward), and the new RM weights are pushed into the running server
# (every PUBLISH_EVERY RM steps). Needs verl's v1 trainer deps (verl[verl-core]).
#
#   RM_PATH=/models/my-rm RM_PYTHON=/envs/rm/bin/python RM_GPUS=7 \
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct DATA=$HOME/data/gsm8k bash recipes/grpo_math_online_rm.sh
#
# GPUs: N_GPUS for the policy, RM_GPUS for the reward server, RM_TRAIN_GPUS (1) for
# the RM trainer (a Ray worker group of its own). RM_MODE: head_only | lora | full.
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
N_GPUS=${N_GPUS:-6}
RM_MODE=${RM_MODE:-lora}
PUBLISH_EVERY=${PUBLISH_EVERY:-1}
RM_SERVER_FLAGS="--enable-weight-updates ${RM_SERVER_FLAGS:-}"
# verl imports this module in every process, which registers trainer mode vllm_rm_online.
export VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.sync.online_trainer

run_main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    reward.reward_manager.name=vllm_rm \
    reward.num_workers=8 \
    +reward.reward_kwargs.server_url="$RM_URL" \
    +reward.reward_kwargs.combine=weighted \
    +reward.reward_kwargs.alpha=0.3 \
    +reward.reward_kwargs.failure_policy=raise \
    trainer.use_v1=True \
    trainer.v1.trainer_mode=vllm_rm_online \
    +online_rm.model_path="$RM_PATH" \
    +online_rm.server_url="$RM_URL" \
    +online_rm.training_mode="$RM_MODE" \
    +online_rm.publish_every="$PUBLISH_EVERY" \
    +online_rm.reward_key=verifiable_score \
    +online_rm.lr=1e-5 \
    +online_rm.num_workers="${RM_TRAIN_GPUS:-1}" \
    +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=verl_vllm_rm.sync.online_trainer \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.total_epochs=3 \
    trainer.test_freq=10 \
    trainer.project_name=verl_vllm_rm \
    trainer.experiment_name=grpo_gsm8k_online_rm \
    "$@"
