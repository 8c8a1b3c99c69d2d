"""Reward-model training steps (Bradley-Terry pairwise); no verl, no vllm."""
