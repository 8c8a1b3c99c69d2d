"""The server refuses at start-up a model it cannot serve as a reward model, saying why and what to serve
instead, rather than serving numbers nobody can read as a reward (docs/reward_model_families.md; the messages:
docs/troubleshooting.md, "The server refuses the model").

Two real starts: a causal LM without ``--step-tokens`` (refused before the engine loads: vLLM's pooling runner
would only embed it), and a ``Qwen2ForProcessRewardModel`` without ``--step-tag-id`` (refused once the engine
has told its tasks: the process reward model scores steps at a tag it was not given). Every other refusal of the
head's shape is checked on :func:`~verl_vllm_rm.protocol.model_shape.model_shape` itself
(tests/unit/protocol/test_model_shape.py) and before the engine (tests/integration/server/test_reward_head.py).
"""

from __future__ import annotations

import pytest

from verl_vllm_rm.dev.tiny_judge import build_tiny_judge
from verl_vllm_rm.dev.tiny_rm_families import build_tiny_qwen2_prm
from verl_vllm_rm.protocol.model_shape import SERVABLE
from verl_vllm_rm.replicas.launcher import ServerStartError, start_server

pytestmark = pytest.mark.server  # starts its own servers (which must refuse)

@pytest.mark.parametrize("build, reason", [
    (build_tiny_judge, "Qwen2ForCausalLM is a causal LM, without a reward head (vLLM's pooling runner would only "
                       "embed it): " + SERVABLE),
    (build_tiny_qwen2_prm, "Qwen2ForProcessRewardModel scores steps at a step tag: start the server with "
                           "--step-tag-id ID (the tokenizer's id of the step separator, <extra_0> in "
                           "Qwen2.5-Math-PRM)"),
], ids=["causal-lm", "prm-without-step-tag"])
def test_start_up_refuses_a_model_it_cannot_serve_as_a_reward_model(tmp_path, server_args, build, reason):
    model = str(build(tmp_path / "model"))
    log = tmp_path / "server.log"
    with pytest.raises(ServerStartError, match="server exited with code 1"):
        start_server(model, server_args, log_path=log, startup_timeout_s=300)
    text = log.read_text(errors="replace")
    assert f"verl-vllm-rm: {model}: {reason}" in text, text[-3000:]
