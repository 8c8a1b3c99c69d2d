"""The reward model trained during the run (opt-in, ``+online_rm.*``): best-vs-worst preference pairs from each PPO
step, a Bradley-Terry step on verl's critic engine in a Ray worker group of its own, the publish of the new weights
after it, its checkpoint and the export of the trained RM. The trainer modes that drive it are ``plugin/``'s."""
