"""The trainer side's one HTTP layer and the scoring client on it: options, batching, length fitting."""
