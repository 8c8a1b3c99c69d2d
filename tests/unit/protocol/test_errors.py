"""How a client reads a server's error answers: a server whose weights are lost says so, and the fleet can tell."""

from __future__ import annotations

import json

from verl_vllm_rm.protocol.errors import WEIGHTS_LOST, weights_lost

LOST = f"{WEIGHTS_LOST}the reload failed half-way (RuntimeError: boom) and could not be undone: ..."


def test_a_503_health_naming_lost_weights_gives_the_servers_account():
    body = json.dumps({"status": "error", "type": "reward_model", "error": LOST, "version": None})
    assert weights_lost(503, body) == LOST
    assert weights_lost(503, LOST) == LOST  # /score's error body, as error_message reads it


def test_any_other_answer_is_not_lost_weights():
    dead_engine = json.dumps({"status": "error", "type": "reward_model", "error": "EngineDeadError: ..."})
    assert weights_lost(503, dead_engine) is None
    assert weights_lost(409, LOST) is None  # a refusal quoting the state is not the /health answer
    assert weights_lost(None, "ConnectionRefusedError: ...") is None
