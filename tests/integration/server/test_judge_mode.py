"""``--runner generate``: the server serves a generative judge. Its defaults and refusals happen before the engine
loads (checked here in one server-side interpreter, with the other start-up flag conflicts refused at that point:
one vLLM import for all of them); serving a judge is tested in tests/integration/judge/test_client.py
(a real engine)."""

from __future__ import annotations

import json

import pytest
from start_args import before_the_engine as run_before_the_engine

pytestmark = pytest.mark.server  # runs in the server's environment (.venv-server's vLLM), like every server test

JUDGE_CASES = [
    ["--runner", "generate"],  # answers without free whitespace: a small judge's JSON then always ends
    ["--runner", "generate", "--structured-outputs-config", '{"backend": "guidance"}'],  # the user's choice
    [],  # a reward model: vLLM's own default
    ["--runner", "generate", "--enable-weight-updates"],
    ["--runner", "generate", "--step-tag-id", "5"],
    ["--runner", "generate", "--step-tokens", "+,-"],
    ["--runner", "generate", "--reward-head", "attributes"],
    ["--runner", "generate", "--engine-stall-timeout", "30"],  # the watch probes a reward model's pooling engine
]
WEIGHT_UPDATE_CASES = [  # flags that would undo what --enable-weight-updates sets
    ["--enable-weight-updates", "--weight-transfer-config", '{"backend": "nccl"}'],
    ["--enable-weight-updates", "--worker-extension-cls", "my_pkg.MyExtension"],
    ["--enable-weight-updates", "--weight-update-lora-bases-max-bytes", "-1"],  # not a flag conflict: a bad value
    ["--enable-weight-updates", "--weight-update-rollback-max-bytes", "-1"],
    ["--enable-weight-updates", "--weight-update-stall-timeout", "0"],
    ["--enable-weight-updates", "--weight-update-join-timeout", "nan"],
]
STALL_CASES = [["--engine-stall-timeout", "-1"], ["--engine-stall-timeout", "inf"]]


@pytest.fixture(scope="module")
def before_the_engine(tmp_path_factory) -> tuple[list, str]:
    """What ``apply_reward_defaults`` made of each case (its exit message, or the judge's structured-output
    settings), and the interpreter's stderr; the last case asks a reward model's checkpoint (its config.json) to
    judge."""
    classifier = tmp_path_factory.mktemp("classifier")
    (classifier / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"]}))
    cases = [["--model", "m", *case] for case in JUDGE_CASES + WEIGHT_UPDATE_CASES + STALL_CASES]
    cases.append(["--model", str(classifier), "--runner", "generate"])
    return run_before_the_engine(cases, ["args.structured_outputs_config.backend",
                                         "args.structured_outputs_config.disable_any_whitespace"])


def test_judge_defaults_and_refusals_before_the_engine(before_the_engine):
    results, stderr = before_the_engine
    got = results[:len(JUDGE_CASES)]
    assert got[:3] == [["xgrammar", True], ["guidance", False], ["auto", False]]
    for (kind, message), flag in zip(got[3:], ("--enable-weight-updates", "--step-tag-id", "--step-tokens",
                                                "--reward-head", "--engine-stall-timeout")):
        assert kind == "exit" and message == (
            f"verl-vllm-rm: {flag} is for a reward model (--runner pooling); a generative judge (--runner generate) "
            f"takes no {flag}: drop one of the two")
    assert "pad its JSON answer with whitespace" in stderr  # the user's config without it is warned about


def test_weight_updates_refuse_an_engine_or_extension_of_the_users_before_the_engine(before_the_engine):
    """--enable-weight-updates sets vLLM's weight-transfer engine and worker extension itself: an operator's own
    choice of either would silently replace ours, so the server refuses to start, naming the flag to drop."""
    results, _ = before_the_engine
    assert results[len(JUDGE_CASES):len(JUDGE_CASES) + len(WEIGHT_UPDATE_CASES)] == [
        ["exit", "verl-vllm-rm: --enable-weight-updates sets the weight-transfer engine itself; drop "
                 "--weight-transfer-config and choose the transport with --weight-update-backend"],
        ["exit", "verl-vllm-rm: --enable-weight-updates needs --worker-extension-cls "
                 "verl_vllm_rm.server.weights.worker_extension.WeightSyncWorkerExtension, got my_pkg.MyExtension: "
                 "drop --worker-extension-cls (the server sets it)"],
        ["exit", "verl-vllm-rm: --weight-update-lora-bases-max-bytes must be a number of bytes >= 0, got -1"],
        ["exit", "verl-vllm-rm: --weight-update-rollback-max-bytes must be a number of bytes >= 0, got -1"],
        ["exit", "verl-vllm-rm: --weight-update-stall-timeout must be a positive number of seconds, got 0.0"],
        ["exit", "verl-vllm-rm: --weight-update-join-timeout must be a positive number of seconds, got nan"],
    ]


def test_the_engine_stall_timeout_must_be_a_number_of_seconds(before_the_engine):
    results, _ = before_the_engine
    assert results[len(JUDGE_CASES) + len(WEIGHT_UPDATE_CASES):-1] == [
        ["exit", f"verl-vllm-rm: --engine-stall-timeout must be a number of seconds >= 0 (0: off), got {value}"]
        for value in ("-1.0", "inf")]


def test_a_reward_models_checkpoint_is_refused_as_a_judge_before_the_engine(before_the_engine):
    """vLLM's generate runner would load it as a causal LM and fail on the head's weights, 40 s later, without
    saying the cause: refused first, naming the way to serve it."""
    results, _ = before_the_engine
    kind, message = results[-1]
    assert kind == "exit" and message.endswith(
        ": Qwen2ForSequenceClassification is a reward model, which does not generate: a judge (--runner generate) "
        "needs a causal LM (*ForCausalLM); serve this model as a reward model (without --runner generate)")
