"""Everything verl calls into: plugin registration, the trainer modes, reward-loop workers, the whitening checkpoint."""
