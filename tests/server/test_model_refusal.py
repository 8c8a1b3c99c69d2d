"""The server refuses at start-up a model without a single-label classification head (README: "The model
must support sequence classification with num_labels=1; anything else is refused at start-up").

Two real starts of the server, each with a model built here from the tiny RM: a causal LM (no
classification head: vLLM's pooling runner can only embed it) and a two-label classifier. Each must
exit non-zero, saying why, instead of serving scores nobody can read as one reward.
"""

from __future__ import annotations

import pytest

from verl_vllm_rm.replicas.launcher import ServerStartError, start_server

pytestmark = pytest.mark.server  # starts its own servers (which must refuse)


def two_label_classifier(tiny_rm: str, out) -> str:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm, num_labels=2, ignore_mismatched_sizes=True,
                                                               dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_rm).save_pretrained(out)
    return str(out)


def causal_lm(tiny_rm: str, out) -> str:
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2ForCausalLM

    config = AutoConfig.from_pretrained(tiny_rm)
    config.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_rm).save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("build, reason", [
    (causal_lm, r"does not support sequence classification \(tasks: \[[^]]*\]\); serve a "  # (a set's order)
                r"\*ForSequenceClassification reward model with --runner pooling, or a generative judge with "
                r"--runner generate"),
    (two_label_classifier, r"has num_labels=2; a reward model needs a scalar head \(num_labels=1\)"),
], ids=["causal-lm", "two-labels"])
def test_start_up_refuses_a_model_without_a_scalar_head(tmp_path, tiny_rm, server_args, build, reason):
    import re

    model = build(tiny_rm, tmp_path / "model")
    log = tmp_path / "server.log"
    with pytest.raises(ServerStartError, match="server exited with code 1"):
        start_server(model, server_args, log_path=log, startup_timeout_s=300)
    assert re.search(rf"verl-vllm-rm: {re.escape(model)} {reason}", log.read_text(errors="replace")), \
        log.read_text(errors="replace")[-3000:]
