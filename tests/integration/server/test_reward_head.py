"""How the server is set up for a reward head before the engine loads (``server/reward_head.py``), in one
server-side interpreter: Math-Shepherd's ``--step-tokens`` (ids, or strings resolved as its card encodes them) and
``--step-tag`` become vLLM's classify conversion over the two token logits, read at the step tags; every malformed
or conflicting start is refused with the fix, and a causal LM served without them is refused before the engine
(served, vLLM would only embed it). Serving each family is tested in test_model_families.py; the config's
``reward_token`` in process, tests/unit/server/test_reward_head.py."""

from __future__ import annotations

import pytest
from start_args import before_the_engine

from verl_vllm_rm.dev.tiny_judge import build_tiny_judge
from verl_vllm_rm.dev.tiny_math_shepherd import BAD, GOOD, STEP_TAG, build_tiny_math_shepherd
from verl_vllm_rm.protocol.model_shape import SERVABLE

pytestmark = pytest.mark.server  # runs in the server's environment (.venv-server's vLLM)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Each case's start on the tiny causal LM (a byte-level BPE: ``-`` and ``Ġ-`` are two tokens) or on the tiny
    Math-Shepherd (a Metaspace BPE: ``▁+`` and a bare ``+``, the step tag ``▁ки``), in one server interpreter."""
    from transformers import AutoTokenizer

    causal_lm = str(build_tiny_judge(tmp_path_factory.mktemp("causal_lm")))
    shepherd = str(build_tiny_math_shepherd(tmp_path_factory.mktemp("shepherd")))
    good, bad = AutoTokenizer.from_pretrained(causal_lm).convert_tokens_to_ids(["+", "-"])
    cases = {
        "served": [causal_lm, "--step-tokens", f"{good},{bad}", "--step-tag-id", "5"],
        "card strings": [shepherd, "--step-tokens", "What,answer", "--step-tag", STEP_TAG],
        "card ids": [shepherd, "--step-tokens", "{good},{bad}", "--step-tag", STEP_TAG],
        "bare": [causal_lm],
        "one token": [causal_lm, "--step-tokens", "+", "--step-tag-id", "5"],
        "ambiguous": [shepherd, "--step-tokens", "+,-", "--step-tag", STEP_TAG],
        "not one each": [shepherd, "--step-tokens", "+,What is", "--step-tag", STEP_TAG],
        "ids outside": [shepherd, "--step-tokens", "3,100000", "--step-tag", STEP_TAG],
        "tag of two tokens": [shepherd, "--step-tokens", "{good},{bad}", "--step-tag", f"{STEP_TAG} {STEP_TAG}"],
        "tag and another id": [shepherd, "--step-tokens", "{good},{bad}", "--step-tag", STEP_TAG, "--step-tag-id", "5"],
        "no tag": [causal_lm, "--step-tokens", f"{good},{bad}"],
        "convert": [causal_lm, "--step-tokens", f"{good},{bad}", "--step-tag-id", "5", "--convert", "embed"],
    }
    card = AutoTokenizer.from_pretrained(shepherd)
    pieces = {"good": card.convert_tokens_to_ids("▁" + GOOD), "bad": card.convert_tokens_to_ids("▁" + BAD)}
    for case in ("card ids", "tag of two tokens", "tag and another id"):
        cases[case] = [a.format(**pieces) for a in cases[case]]
    got, _ = before_the_engine([["--model", model, *argv] for model, *argv in cases.values()],
                               ["args.convert", "args.hf_overrides", "args.pooler_config", "args.step_token_ids"])
    return {"causal_lm": causal_lm, "shepherd": shepherd, "card": card, "good": good, "bad": bad}, \
        dict(zip(cases, got))


def test_step_tokens_serve_a_causal_lm_as_two_token_logits_read_at_step_tags(results):
    models, got = results
    good, bad = models["good"], models["bad"]
    assert got["served"] == ["classify", {"method": "no_post_processing", "classifier_from_token": ["+", "-"]},
                             {"tok_pooling_type": "STEP", "step_tag_id": 5}, [good, bad]]


def test_step_tokens_and_tag_as_strings_resolve_as_the_cards_encoding_and_ids_as_given(results):
    """Math-Shepherd's card: ``encode("+ -")[1:]`` and ``encode("ки")[-1]``, the Metaspace pieces; vLLM gets the
    pieces' spellings for its head (it looks them up with convert_tokens_to_ids). Strings the vocabulary holds
    only as the card encodes them (``▁What``, ``▁answer``: no bare ``What``) resolve to those pieces."""
    models, got = results
    card = models["card"]
    good, bad = card.encode(f"{GOOD} {BAD}")[1:]
    tag = card.encode(STEP_TAG)[-1]
    assert card.convert_ids_to_tokens([good, bad, tag]) == ["▁+", "▁-", "▁ки"]  # the card's pieces
    pooler = {"tok_pooling_type": "STEP", "step_tag_id": tag}
    assert got["card ids"] == ["classify", {"method": "no_post_processing", "classifier_from_token": ["▁+", "▁-"]},
                               pooler, [good, bad]]
    what, answer = card.encode("What answer")[1:]
    assert got["card strings"] == ["classify", {"method": "no_post_processing",
                                                "classifier_from_token": ["▁What", "▁answer"]}, pooler, [what, answer]]


@pytest.mark.parametrize("case, message", [
    ("bare", "{causal_lm}: Qwen2ForCausalLM is a causal LM, without a reward head (vLLM's pooling runner would only "
             "embed it): " + SERVABLE),
    ("one token", "--step-tokens takes two token ids or strings GOOD,BAD, got '+'"),
    ("ambiguous", "--step-tokens '+,-' is ambiguous in {shepherd}'s vocabulary: the card's encoding of '+ -' reads "
                  "'▁+' ({card_good}), '▁-' ({card_bad}), and the vocabulary also holds '+' ({bare_good}), '-' "
                  "({bare_bad}): give the ids the model's card reads (--step-tokens {card_good},{card_bad})"),
    ("not one each", "--step-tokens '+,What is': the card's encoding of '+ What is' gives 3 tokens ('▁+' "
                     "({card_good}), '▁What' ({what}), '▁is' ({is_})), not one per string: give the two token ids "
                     "(--step-tokens GOOD_ID,BAD_ID)"),
    ("ids outside", "--step-tokens ids [100000] are outside {shepherd}'s tokenizer of {card_len} tokens"),
    ("tag of two tokens", "--step-tag 'ки ки' is 2 tokens of {shepherd}'s tokenizer ('▁ки' ({tag}), '▁ки' ({tag})), "
                          "not one: give the tag as one token's text, or its id with --step-tag-id"),
    ("tag and another id", "--step-tag 'ки' is token '▁ки' ({tag}), and --step-tag-id is 5 ({five}): drop one of "
                           "them"),
    ("no tag", "--step-tokens reads P(good) over the two tokens at each step tag: give --step-tag-id (or --step-tag) "
               "too (the tokenizer's id of the step separator)"),
    ("convert", "--step-tokens serves the model with --convert classify; drop --convert embed"),
])
def test_a_malformed_or_conflicting_reward_head_start_is_refused_with_the_fix(results, case, message):
    models, got = results
    card = models["card"]
    ids = dict(card_good=card.convert_tokens_to_ids("▁+"), card_bad=card.convert_tokens_to_ids("▁-"),
               bare_good=card.convert_tokens_to_ids("+"), bare_bad=card.convert_tokens_to_ids("-"),
               what=card.convert_tokens_to_ids("▁What"), is_=card.convert_tokens_to_ids("▁is"), card_len=len(card),
               tag=card.convert_tokens_to_ids("▁ки"), five=f"{card.convert_ids_to_tokens(5)!r} (5)")
    assert got[case] == ["exit", "verl-vllm-rm: " + message.format(causal_lm=models["causal_lm"],
                                                                  shepherd=models["shepherd"], **ids)]
