"""Reward observability: per-step reward metrics, reward-hacking alarms and the after-run report.

Pure numpy over one step's per-sample columns (what the reward manager put in
``reward_extra_info``); verl's trainer side lives in ``plugin.trainer_modes``.
"""
