"""The reward head set up before the engine (``server.reward_head``), in process, over the tiny RM's tokenizer (a
byte-level BPE: ``+`` and ``Ġ+`` are two tokens): ``--step-tokens`` and ``--step-tag`` resolved as a model's card
encodes them, vLLM's arguments they become, and each malformed or conflicting start refused naming the fix (the
same starts through the server's own argument parsing, and Math-Shepherd's Metaspace tokenizer:
tests/integration/server/test_reward_head.py)."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from verl_vllm_rm.protocol.model_shape import SERVABLE, STEP_TOKENS_NEED_A_TAG
from verl_vllm_rm.server.reward_head import configure_reward_head, step_tag, step_tag_id, step_token_ids

PLUS, MINUS, SPACE_MINUS, HE = 15, 17, 291, 271  # '+', '-', 'Ġ-', 'he' in the tiny RM's vocabulary


def args(model: str, **given) -> argparse.Namespace:
    """The server's arguments that concern the head, as argparse leaves them with ``given`` on the command line."""
    defaults = dict(model=model, tokenizer=None, trust_remote_code=False, step_tokens=None, step_tag=None,
                    step_tag_id=None, convert="auto", hf_overrides=None, pooler_config=None, reward_head="auto")
    return argparse.Namespace(**{**defaults, **given})


def test_step_tokens_given_as_ids_are_taken_as_they_are(tokenizer):
    assert step_token_ids("15,17", tokenizer, "rm") == (PLUS, MINUS)
    assert step_token_ids(" 999 , 0", tokenizer, "rm") == (999, 0)


@pytest.mark.parametrize("spec, message", [
    ("+", "--step-tokens takes two token ids or strings GOOD,BAD, got '+'"),
    ("1,2,3", "--step-tokens takes two token ids or strings GOOD,BAD, got '1,2,3'"),
    ("1, ", "--step-tokens takes two token ids or strings GOOD,BAD, got '1, '"),
    ("15,1000", "--step-tokens ids [1000] are outside rm's tokenizer of 1000 tokens"),
    ("+,-", "--step-tokens '+,-' is ambiguous in rm's vocabulary: the card's encoding of '+ -' reads '+' (15), 'Ġ-' "
            "(291), and the vocabulary also holds '-' (17): give the ids the model's card reads "
            "(--step-tokens 15,291)"),
    ("+,hel", "--step-tokens '+,hel': the card's encoding of '+ hel' gives 4 tokens ('+' (15), 'Ġ' (225), 'he' (271), "
              "'l' (80)), not one per string: give the two token ids (--step-tokens GOOD_ID,BAD_ID)"),
], ids=["one", "three", "empty", "outside", "ambiguous", "not one each"])
def test_malformed_or_ambiguous_step_tokens_are_refused_with_the_fix(tokenizer, spec, message):
    with pytest.raises(SystemExit, match="^" + re.escape(f"verl-vllm-rm: {message}")):
        step_token_ids(spec, tokenizer, "rm")


def test_a_step_tag_is_the_one_token_its_text_encodes_to(tokenizer):
    assert step_tag_id("+", None, tokenizer, "rm") == PLUS
    assert step_tag_id("he", HE, tokenizer, "rm") == HE
    with pytest.raises(SystemExit, match=re.escape("verl-vllm-rm: --step-tag 'hel' is 2 tokens of rm's tokenizer "
                                                   "('he' (271), 'l' (80)), not one: give the tag as one token's "
                                                   "text, or its id with --step-tag-id")):
        step_tag_id("hel", None, tokenizer, "rm")
    with pytest.raises(SystemExit, match=re.escape("verl-vllm-rm: --step-tag '+' is token '+' (15), and --step-tag-id "
                                                   "is 17 ('-' (17)): drop one of them")):
        step_tag_id("+", MINUS, tokenizer, "rm")


def test_a_step_tag_id_alone_pools_at_that_token_and_keeps_the_rest(tiny_rm):
    given = args(tiny_rm, step_tag_id=5, pooler_config={"normalize": False})
    configure_reward_head(given)
    assert given.pooler_config == {"normalize": False, "tok_pooling_type": "STEP", "step_tag_id": 5}
    assert (given.step_token_ids, given.convert, given.hf_overrides) == (None, "auto", None)
    plain = args(tiny_rm)
    configure_reward_head(plain)
    assert (plain.pooler_config, plain.step_token_ids, plain.step_tag_id) == (None, None, None)


def test_step_tokens_serve_the_model_as_a_classifier_over_the_two_tokens_at_the_tag(tiny_rm):
    given = args(tiny_rm, step_tokens="15,291", step_tag="he", hf_overrides={"rope_theta": 1.0})
    configure_reward_head(given)
    assert given.step_tag_id == HE and given.step_token_ids == (PLUS, SPACE_MINUS) and given.convert == "classify"
    assert given.hf_overrides == {"rope_theta": 1.0, "method": "no_post_processing",
                                  "classifier_from_token": ["+", "Ġ-"]}
    assert given.pooler_config == {"tok_pooling_type": "STEP", "step_tag_id": HE}
    assert step_tag(given) == (HE, "he")


def test_the_step_tags_text_is_its_tokens_spelling_when_only_its_id_is_given(tiny_rm):
    assert step_tag(args(tiny_rm)) is None
    assert step_tag(args(tiny_rm, step_tag_id=PLUS)) == (PLUS, "+")


@pytest.mark.parametrize("given, message", [
    (dict(step_tokens="15,17"), STEP_TOKENS_NEED_A_TAG),
    (dict(step_tokens="15,17", step_tag_id=5, convert="embed"),
     "--step-tokens serves the model with --convert classify; drop --convert embed"),
], ids=["no tag", "another convert"])
def test_step_tokens_without_a_tag_or_with_another_conversion_are_refused(tiny_rm, given, message):
    with pytest.raises(SystemExit, match="^" + re.escape(f"verl-vllm-rm: {message}") + "$"):
        configure_reward_head(args(tiny_rm, **given))


def test_a_causal_lm_without_a_reward_head_is_refused_before_the_engine_loads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(SystemExit, match="^" + re.escape(
            f"verl-vllm-rm: {tmp_path}: Qwen2ForCausalLM is a causal LM, without a reward head (vLLM's pooling runner "
            f"would only embed it): {SERVABLE}") + "$"):
        configure_reward_head(args(str(tmp_path)))
    configure_reward_head(args(str(tmp_path), convert="classify"))  # converted by vLLM: no refusal here
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"]}))
    configure_reward_head(args(str(tmp_path)))


def test_a_config_reward_token_is_read_with_its_spelling_and_one_outside_the_tokenizer_is_refused(tiny_rm):
    """``reward_token`` reads the served config (``model_config.hf_config``) and the tokenizer; the server appends
    that token to every input (tests/integration/server/test_model_families.py serves InternLM2-Reward's kind)."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from verl_vllm_rm.server.reward_head import reward_token

    args = SimpleNamespace(model=tiny_rm, tokenizer=None, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_rm)

    def served(**config):
        return reward_token(args, SimpleNamespace(hf_config=SimpleNamespace(**config)))

    assert served() is None
    assert served(reward_token_id=tokenizer.eos_token_id) == (tokenizer.eos_token_id, tokenizer.eos_token)
    refusal = (f"verl-vllm-rm: {tiny_rm}: the config's reward_token_id {len(tokenizer)} is outside its tokenizer's "
               f"{len(tokenizer)} tokens: serve the tokenizer the model was published with (--tokenizer)")
    with pytest.raises(SystemExit, match=f"^{re.escape(refusal)}$"):
        served(reward_token_id=len(tokenizer))
