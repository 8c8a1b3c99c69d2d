"""How the server is set up for a reward head before the engine loads (``server/reward_head.py``), in one
server-side interpreter: Math-Shepherd's ``--step-tokens`` becomes vLLM's classify conversion over the two token
logits, read at the step tags; every malformed or conflicting start is refused with the fix, and a causal LM
served without them is refused before the engine (served, vLLM would only embed it). Serving each family is
tested in test_model_families.py."""

from __future__ import annotations

import pytest
from start_args import before_the_engine

from verl_vllm_rm.dev.tiny_judge import build_tiny_judge
from verl_vllm_rm.protocol.model_shape import SERVABLE

pytestmark = pytest.mark.server  # runs in the server's environment (.venv-server's vLLM)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    causal_lm = str(build_tiny_judge(tmp_path_factory.mktemp("causal_lm")))
    cases = {
        "served": ["--step-tokens", "+,-", "--step-tag-id", "5"],
        "bare": [],
        "one token": ["--step-tokens", "+", "--step-tag-id", "5"],
        "unknown token": ["--step-tokens", "+,not-a-token", "--step-tag-id", "5"],
        "no tag": ["--step-tokens", "+,-"],
        "convert": ["--step-tokens", "+,-", "--step-tag-id", "5", "--convert", "embed"],
    }
    got, _ = before_the_engine([["--model", causal_lm, *argv] for argv in cases.values()],
                               ["args.convert", "args.hf_overrides", "args.pooler_config", "args.step_token_ids"])
    return causal_lm, dict(zip(cases, got))


def test_step_tokens_serve_a_causal_lm_as_two_token_logits_read_at_step_tags(results):
    causal_lm, got = results
    from transformers import AutoTokenizer

    good, bad = AutoTokenizer.from_pretrained(causal_lm).convert_tokens_to_ids(["+", "-"])
    assert got["served"] == ["classify", {"method": "no_post_processing", "classifier_from_token": ["+", "-"]},
                             {"tok_pooling_type": "STEP", "step_tag_id": 5}, [good, bad]]


@pytest.mark.parametrize("case, message", [
    ("bare", "{model}: Qwen2ForCausalLM is a causal LM, without a reward head (vLLM's pooling runner would only "
             "embed it): " + SERVABLE),
    ("one token", "--step-tokens takes two token strings GOOD,BAD, got '+'"),
    ("unknown token", "--step-tokens ['not-a-token'] not in {model}'s vocabulary (vLLM would read the unknown token "
                      "instead): give tokens as the tokenizer spells them (tokenizer.convert_ids_to_tokens)"),
    ("no tag", "--step-tokens reads P(good) over the two tokens at each step tag: give --step-tag-id too (the "
               "tokenizer's id of the step separator)"),
    ("convert", "--step-tokens serves the model with --convert classify; drop --convert embed"),
])
def test_a_malformed_or_conflicting_reward_head_start_is_refused_with_the_fix(results, case, message):
    causal_lm, got = results
    assert got[case] == ["exit", "verl-vllm-rm: " + message.format(model=causal_lm)]
