#!/usr/bin/env bash
# GRPO on GSM8K with a verifiable reward (verl's gsm8k compute_score) blended with a
# reward model served by vLLM: reward = alpha * rm + (1 - alpha) * correctness.
#
#   RM_PATH=/models/my-rm RM_GPUS=7 \
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct DATA=$HOME/data/gsm8k bash recipes/grpo_math_rm_weighted.sh
# The RM must share the policy's tokenizer for input_format=token_ids (the default);
# otherwise add +reward.reward_kwargs.input_format=chat_template and rm_tokenizer_path.
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
N_GPUS=${N_GPUS:-7}

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
    trainer.v1.trainer_mode=vllm_rm \
    reward.num_workers=8 \
    +reward.reward_kwargs.server_url="$RM_URL" \
    +reward.reward_kwargs.combine=weighted \
    +reward.reward_kwargs.alpha=0.3 \
    +reward.reward_kwargs.failure_policy=raise \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.total_epochs=3 \
    trainer.test_freq=10 \
    trainer.project_name=verl_vllm_rm \
    trainer.experiment_name=grpo_gsm8k_rm_weighted \
    "$@"
