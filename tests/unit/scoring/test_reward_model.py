"""One reward model as the manager uses it (``scoring/reward_model.py``), with no server: its raw reward from an
answer (the score, its response's steps aggregated, its weighted attributes), its scale (whitened or raw), its input
from a sample, what it refuses of a served head and of a step format (told what ``/health`` would say, as its probe
does), and the trainers that cannot place token-level step rewards. The probe against a real server:
tests/integration/scoring/test_process_rewards.py and tests/integration/server/test_model_families.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape
from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.options import parse_options
from verl_vllm_rm.scoring.reward_model import (
    RewardModel,
    Scored,
    ServedHeadError,
    StepRewardError,
    refuse_token_level_when_streaming,
    trainer_class,
)
from verl_vllm_rm.scoring.rm_inputs import RMInput

TAG = 9  # the step tag's id in the answers below
LABELS = ("helpfulness", "correctness", "verbosity")


def rm_of(tokenizer=None, **options) -> RewardModel:
    (opts,) = parse_options({"server_url": "http://127.0.0.1:1", "reward_models": [{"name": "rm", **options}]}
                            ).rm_options
    return RewardModel(opts, tokenizer, coalesce_s=0.0)


def shape(kind: HeadKind, labels=("score",)) -> ModelShape:
    return ModelShape(kind, "SomeForSequenceClassification", labels, "float32", "float32")


def answer(score=None, steps=None, attributes=None, version=3) -> Scored:
    return Scored(score, version, 0.0, steps, 0, attributes)


# RM input: prompt [TAG, 4, TAG] (two tags the server scores too) + response [5, TAG, 6, TAG]
STEP_INPUT = RMInput(np.array([TAG, 4, TAG, 5, TAG, 6, TAG]), ("uid", "u"), 0, 3)
STEPS = [0.1, 0.2, 0.5, -1.0]  # one per tag of the whole input


def test_an_outcome_rms_reward_is_its_score():
    assert rm_of().value(answer(0.75), STEP_INPUT) == 0.75


@pytest.mark.parametrize(("method", "want"), [("min", -1.0), ("last", -1.0), ("mean", -0.25), ("token", -0.5),
                                              ("prod", 1 / (1 + math.exp(-0.5)) / (1 + math.exp(1.0)))])
def test_a_process_rms_reward_is_its_responses_steps_aggregated(method, want):
    rm = rm_of(step_reward=method)
    rm.step_tag_id = TAG  # what the probe reads from /health
    assert rm.response_steps(answer(steps=STEPS), STEP_INPUT) == [0.5, -1.0]  # the prompt's own tags left out
    assert rm.value(answer(steps=STEPS), STEP_INPUT) == pytest.approx(want)


def test_an_answer_that_gives_no_reward_is_refused_naming_why():
    with pytest.raises(ServedHeadError, match=r"reward model 'rm': its server gave no outcome score \(its head gives "
                                              r"step scores or attributes only"):
        rm_of().value(answer(None, steps=STEPS), STEP_INPUT)
    rm = rm_of(step_reward="min")
    rm.step_tag_id = TAG
    no_step = RMInput(np.array([TAG, 4, 5, 6]), ("uid", "u"), 0, 2)
    with pytest.raises(StepRewardError, match=r"reward model 'rm' \(step_reward=min\): the response has no step tag "
                                              r"\(token id 9\), so it has no process reward"):
        rm.value(answer(steps=[0.3]), no_step)
    with pytest.raises(StepRewardError, match=r"reward model 'rm' has step_reward=min but its server returns no step "
                                              r"scores: start it with --step-tag-id"):
        rm.value(answer(0.3), STEP_INPUT)


def test_an_attribute_rms_reward_is_the_weighted_sum_of_the_attributes_it_names():
    rm = rm_of(attributes={"verbosity": -0.5, "helpfulness": 1.0})
    assert rm.attribute_columns is None  # known once the served head is
    rm.check_head(shape(HeadKind.ATTRIBUTES, LABELS))
    assert rm.attribute_columns == {"helpfulness": 0, "verbosity": 2}  # by name, each its column in the head
    scored = answer(attributes=[2.0, 100.0, 3.0])  # correctness is not weighted
    assert rm.value(scored, STEP_INPUT) == 2.0 - 0.5 * 3.0
    assert rm.scale(scored, 0.5, update=True) == (0.5, [2.0, 3.0])  # not whitened: the raw sum, the values read


def test_a_whitened_rm_scales_on_the_scores_it_has_learned_from():
    rm = rm_of(whiten="running")
    assert rm.scale(answer(1.0), 1.0, update=True) == (0.0, None)  # one score: std 1, itself the mean
    assert rm.scale(answer(3.0), 3.0, update=True) == (1.0, None)  # mean 2, std 1
    assert rm.scale(answer(5.0), 5.0, update=False) == (3.0, None)  # validation: on that scale, not added
    assert rm.whitening.count == 2
    assert rm_of().scale(answer(5.0), 5.0, update=True) == (5.0, None)


@pytest.mark.parametrize(("options", "served", "error", "message"), [
    ({}, shape(HeadKind.STEP_CLASSIFIER, ("negative", "positive")), StepRewardError,
     r"serves SomeForSequenceClassification, a process reward model \(step_classifier\): it scores steps only, with "
     r"no outcome score; set step_reward to min, last, mean, prod or token"),
    ({}, shape(HeadKind.ATTRIBUTES, LABELS), ServedHeadError,
     r"with 3 attributes \(helpfulness, correctness, verbosity\) and no single reward: name the ones to use, each with "
     r"its weight, in attributes \(e\.g\. \{helpfulness: 1\.0\}\)"),
    ({"attributes": {"helpfulness": 1.0}}, shape(HeadKind.SCALAR), ServedHeadError,
     r"a scalar head without attributes, and reward model 'rm' weights attributes \['helpfulness'\]: drop attributes"),
    ({"attributes": {"helpfulness": 1.0, "honesty": 1.0}}, shape(HeadKind.ATTRIBUTES, LABELS), ServedHeadError,
     r"whose attributes are \['helpfulness', 'correctness', 'verbosity'\]; attributes names \['honesty'\], which it "
     r"does not have"),
])
def test_a_served_head_the_options_cannot_read_is_refused(options, served, error, message):
    with pytest.raises(error, match=r"^reward model 'rm': its server \['http://127\.0\.0\.1:1'\] .*" + message):
        rm_of(**options).check_head(served)


def test_a_card_step_format_takes_the_tag_the_server_names_and_reads_p_positive():
    rm = rm_of(step_reward="min")
    rm.read_steps_as(shape(HeadKind.STEP_CLASSIFIER, ("negative", "positive")), {"token": "<step>", "id": 4})
    assert (rm.step_format, rm.step_tag, rm.normalize, rm.step_split) == ("qwen_prm", "<step>", True, "\n\n")
    tagged = rm_of(step_reward="min", normalize=False, step_format="tagged")
    tagged.read_steps_as(shape(HeadKind.STEP_CLASSIFIER, ("negative", "positive")), None)
    assert (tagged.step_format, tagged.step_tag, tagged.normalize) == ("tagged", None, False)


@pytest.mark.parametrize(("options", "step_tag", "error", "message"), [
    ({"step_format": "tagged", "system_prompt": "Be strict."}, {"token": "<step>"}, ConfigError,
     r"\(step_format=tagged\): system_prompt goes into a conversation rendered with the RM's chat template, and this "
     r"RM reads the response as it is"),
    ({"step_format": "math_shepherd", "system_prompt": "Be strict."}, {"token": "<step>"}, ConfigError,
     r"\(step_format=math_shepherd\): Math-Shepherd's input is the question and the steps, with no chat template"),
    ({"step_format": "qwen_prm", "rubric_template": "{prompt} {response}"}, {"token": "<step>"}, ConfigError,
     r"\(step_format=qwen_prm\) builds the RM's input from the question and the steps as the model's card does"),
    ({"step_format": "qwen_prm"}, None, StepRewardError,
     r"\(step_format=qwen_prm\) inserts the server's step tag after each step, and its server .* does not name the "
     r"tag's text in /health"),
])
def test_a_step_format_the_options_or_the_server_cannot_serve_is_refused(options, step_tag, error, message):
    with pytest.raises(error, match=r"^reward model 'rm' " + message):
        rm_of(step_reward="min", **options).read_steps_as(shape(HeadKind.STEP_CLASSIFIER, ("n", "p")), step_tag)


def test_a_samples_input_is_its_prompt_and_response_ids_fitted_to_the_max_length():
    rm = rm_of(max_length=4)
    assert rm.ready  # max_length given: no probe needed
    rm_input = rm.rm_input(Sample(np.array([1, 2, 3]), np.array([7, 8]), {"uid": "u1"}))
    assert rm_input.token_ids.tolist() == [2, 3, 7, 8]
    assert (rm_input.group_key, rm_input.prompt_tokens_dropped, rm_input.prompt_len) == (("uid", "u1"), 1, 2)
    assert not rm_of().ready  # the server's max_model_len is needed first


def test_a_chat_template_input_needs_the_raw_chat(tiny_rm, tokenizer):
    rm = rm_of(tokenizer, input_format="chat_template", rm_tokenizer_path=tiny_rm, max_length=64)
    chat = [{"role": "user", "content": "What is two plus two?"}]
    sample = Sample(np.array([1]), np.array(tokenizer.encode("Four.", add_special_tokens=False)), {"raw_prompt": chat})
    prompt_ids, response_ids = rm.render(sample, sample.response_ids, None)
    assert tokenizer.decode(prompt_ids) == "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(response_ids) == "Four.<|im_end|>\n"
    with pytest.raises(ValueError, match=r"^input_format=chat_template needs the raw chat: set "
                                         r"data\.return_raw_chat=True$"):
        rm.render(Sample(np.array([1]), np.array([5]), {}), [5], None)


def test_a_card_formats_response_must_have_steps_each_holding_one_tag(tokenizer):
    rm = rm_of(tokenizer, step_reward="min", step_format="qwen_prm", max_length=256)
    rm.read_steps_as(shape(HeadKind.STEP_CLASSIFIER, ("negative", "positive")), {"token": "<step>"})
    rm.step_tag_id = tokenizer.convert_tokens_to_ids("<step>")
    sample = Sample(np.array(tokenizer.encode("Add 2 and 2.", add_special_tokens=False)), np.array([5]), {})
    _, response_ids = rm.card_step_ids(sample, "Two and two.\n\nIs four.")
    assert tokenizer.decode(response_ids).startswith("Two and two.<step>Is four.<step>")
    with pytest.raises(StepRewardError, match=r"\(step_format=qwen_prm\): the response has no step text \(it is empty "
                                              r"or only '\\n\\n'\)"):
        rm.card_step_ids(sample, "\n\n")
    with pytest.raises(StepRewardError, match=r"the response's 2 steps hold 3 step tags \('<step>', id 4\) once "
                                              r"rendered: a step's own text holds the tag"):
        rm.card_step_ids(sample, "One <step> two.\n\nThree.")


def config(trainer: dict, **reward_model) -> object:
    return OmegaConf.create({"reward": {"reward_model": reward_model}, "trainer": trainer})


def test_token_level_step_rewards_under_a_trainer_that_keeps_the_scalar_are_refused():
    token = rm_of(step_reward="token").options
    with pytest.raises(ConfigError, match=r"reward model\(s\) \['rm'\] have step_reward=token, and this run's trainer "
                                          r"\(the legacy trainer\) keeps only the scalar"):
        refuse_token_level_when_streaming(config({"use_v1": False}), [token])
    with pytest.raises(ConfigError, match=r"\(trainer\.v1\.trainer_mode=sync\) keeps only the scalar"):
        refuse_token_level_when_streaming(config({"v1": {"trainer_mode": "sync"}}), [token])
    refuse_token_level_when_streaming(config({"use_v1": False}), [rm_of(step_reward="min").options])  # a scalar
    refuse_token_level_when_streaming(config({"use_v1": False}, enable=True), [token])  # verl's batch path places them
    assert trainer_class("no_such_trainer_mode") is None
