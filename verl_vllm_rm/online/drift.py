"""How far the online RM has moved: a fixed probe set scored by the server as the run started, then
after every RM step (``drift/mean_abs_change``, ``alarm/drift_rank_corr``).

The probe set is the first PPO step's sequences, scored before the first RM step, so
"initial" is the RM the run (or its resume) started from. It is scored by the reward
server, whose weights are the rewards the policy gets (with ``publish_every > 1`` it
lags the RM trainer until the next publish).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from verl_vllm_rm.client.http import JsonHttp
from verl_vllm_rm.monitor.alarms import drift
from verl_vllm_rm.protocol.score import parse_score_response

#: Sequences in the probe set: enough for a stable rank correlation, one small request a step.
PROBE_SIZE = 64


class DriftProbe:
    """``server()`` gives the server to ask each time (one of the managed replicas in routing may change)."""

    def __init__(self, server: Callable[[], JsonHttp], sequences: list[list[int]]):
        if not sequences:
            raise ValueError("a drift probe needs at least one sequence to score: pass some token ids (the online "
                             "trainer passes its first PPO step's sequences)")
        self.server = server
        self.sequences = [list(s) for s in sequences[:PROBE_SIZE]]
        self.initial = self.score()

    def score(self) -> np.ndarray:
        """The server's raw scores of the probe set now."""
        body = self.server().post("/score", {"input": self.sequences})
        return np.asarray(parse_score_response(body, len(self.sequences)), dtype=np.float64)

    def measure(self) -> dict[str, float]:
        return drift(self.initial, self.score())
