"""Everything verl calls into: plugin registration, the trainer modes and their registry, reward-loop workers, the
whitening checkpoint, and ``verl_seams``: every private verl member the package stands on, checked at start-up."""
