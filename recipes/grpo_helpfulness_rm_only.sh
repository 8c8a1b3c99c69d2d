#!/usr/bin/env bash
# GRPO on a helpfulness set scored by the reward model alone; validation reports the
# pairwise win rate of each response against the prompt's reference answer
# (val-core/<data_source>/win/mean@N, win_and, ref_margin).
#
#   RM_PATH=/models/my-rm RM_GPUS=7 \
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct DATA=$HOME/data/helpfulness bash recipes/grpo_helpfulness_rm_only.sh
# DATA/*.parquet rows carry the chat in "prompt" and the reference answer in
# reward_model.ground_truth (or set reference_source=extra_info:<key>).
# pairwise=always: verl 0.9.1's agent loop does not tell the reward manager which samples are
# validation ones, so pairwise=auto would never compare; always costs one reference score per prompt.
set -euo pipefail
source "$(dirname "$0")/common.sh"
MODEL=${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}
DATA=${DATA:-$HOME/data/helpfulness}
N_GPUS=${N_GPUS:-7}

run_main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=128 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=5e-7 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
    reward.reward_manager.name=vllm_rm \
    trainer.v1.trainer_mode=vllm_rm \
    +reward.reward_kwargs.server_url="$RM_URL" \
    +reward.reward_kwargs.combine=replace \
    +reward.reward_kwargs.input_format=chat_template \
    +reward.reward_kwargs.rm_tokenizer_path="${RM_PATH:-/path/to/rm}" \
    +reward.reward_kwargs.pairwise=always \
    +reward.reward_kwargs.reference_source=ground_truth \
    +reward.reward_kwargs.missing_reference=skip \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes=1 \
    trainer.total_epochs=2 \
    trainer.test_freq=10 \
    trainer.project_name=verl_vllm_rm \
    trainer.experiment_name=grpo_helpfulness_rm_only \
    "$@"
