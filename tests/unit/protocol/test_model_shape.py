"""The served head's family, told from the model's config and vLLM's tasks (pure: no server)."""

import pytest

from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape, UnsupportedModel, model_shape

SEQ_CLS = {"classify", "token_classify"}  # what vLLM 0.32 offers for a *ForSequenceClassification
DTYPES = dict(backbone_dtype="bfloat16", head_dtype="float32")


def shape(architecture="Qwen2ForSequenceClassification", tasks=SEQ_CLS, **kw):
    return model_shape(architecture, tasks, **{"num_labels": 1, **DTYPES, **kw})


def test_a_scalar_sequence_classifier_is_scalar_and_may_be_read_at_step_tags():
    assert shape().kind is HeadKind.SCALAR and shape().labels == ("score",) and not shape().per_token
    assert shape(step_tag_id=7).reads_steps


@pytest.mark.parametrize("architecture", ["Qwen2ForRewardModel", "InternLM2ForRewardModel"])
def test_native_reward_models_are_scalar_read_per_token(architecture):
    got = shape(architecture, {"token_classify"}, num_labels=2)  # the API process's config may say 2: ignored
    assert (got.kind, got.labels, got.per_token) == (HeadKind.SCALAR, ("score",), True)


def test_qwen_prm_is_a_step_classifier_that_needs_its_step_tag():
    got = shape("Qwen2ForProcessRewardModel", {"token_classify"}, num_labels=2, step_tag_id=5)
    assert (got.kind, got.labels, got.step_tag_id) == (HeadKind.STEP_CLASSIFIER, ("negative", "positive"), 5)
    with pytest.raises(UnsupportedModel, match=r"^Qwen2ForProcessRewardModel scores steps at a step tag: start the "
                                               r"server with --step-tag-id ID"):
        shape("Qwen2ForProcessRewardModel", {"token_classify"}, num_labels=2)


def test_a_step_tag_on_a_last_token_reward_model_is_refused():
    with pytest.raises(UnsupportedModel, match=r"Qwen2ForRewardModel gives one reward at the last token; "
                                               r"--step-tag-id would make vLLM pool it at step tags"):
        shape("Qwen2ForRewardModel", {"token_classify"}, step_tag_id=5)


@pytest.mark.parametrize("num_labels, problem_type, head, kind", [
    (2, None, "auto", HeadKind.TWO_CLASS),
    (2, "regression", "auto", HeadKind.ATTRIBUTES),
    (5, None, "auto", HeadKind.ATTRIBUTES),
    (2, None, "attributes", HeadKind.ATTRIBUTES),
    (2, "regression", "two_class", HeadKind.TWO_CLASS),
])
def test_several_outputs_are_two_class_or_attributes(num_labels, problem_type, head, kind):
    id2label = {str(i): f"attr{i}" for i in range(num_labels)}
    got = shape(num_labels=num_labels, problem_type=problem_type, head=head, id2label=id2label)
    assert got.kind is kind and got.labels == tuple(f"attr{i}" for i in range(num_labels))


def test_unnamed_outputs_are_named_by_column():
    assert shape(num_labels=3).labels == ("label_0", "label_1", "label_2")


def test_math_shepherd_style_step_tokens_need_the_step_tag():
    got = shape("Qwen2ForCausalLM", SEQ_CLS, num_labels=2, step_tag_id=9, step_tokens=(11, 12))
    assert (got.kind, got.step_tokens, got.per_token) == (HeadKind.STEP_TOKENS, (11, 12), True)
    with pytest.raises(UnsupportedModel, match=r"^--step-tokens reads P\(good\) over the two tokens at each step "
                                               r"tag: give --step-tag-id \(or --step-tag\) too"):
        shape("Qwen2ForCausalLM", SEQ_CLS, step_tokens=(11, 12))


@pytest.mark.parametrize("kw, message", [
    (dict(num_labels=3, head="scalar"), r"--reward-head scalar needs num_labels=1, and Qwen2ForSequenceClassification "
                                        r"has 3 outputs: use --reward-head attributes"),
    (dict(num_labels=3, head="two_class"), r"--reward-head two_class needs num_labels=2 \(\[bad, good\]\)"),
    (dict(num_labels=3, step_tag_id=4), r"--step-tag-id reads one score per step from a scalar head; this "
                                        r"attributes head has 3 outputs"),
    (dict(head="token"), r"--reward-head must be one of \['auto', 'scalar', 'attributes', 'two_class'\], got 'token'"),
])
def test_mismatched_server_options_are_refused_naming_the_fix(kw, message):
    with pytest.raises(UnsupportedModel, match=message):
        shape(**kw)


def test_a_head_option_that_contradicts_a_native_model_is_refused():
    with pytest.raises(UnsupportedModel, match=r"Qwen2ForRewardModel has a scalar head; --reward-head attributes "
                                               r"does not fit it: leave --reward-head auto"):
        shape("Qwen2ForRewardModel", {"token_classify"}, head="attributes")


def test_a_model_without_a_classification_head_is_refused_listing_what_is_served():
    with pytest.raises(UnsupportedModel, match=r"^Qwen2ForCausalLM has no classification head vLLM serves \(tasks: "
                                               r"\['embed', 'token_embed'\]\): serve a \*ForSequenceClassification"):
        shape("Qwen2ForCausalLM", {"embed", "token_embed"})


def test_the_shape_travels_as_json():
    for got in (shape(num_labels=2), shape("Qwen2ForCausalLM", SEQ_CLS, step_tag_id=9, step_tokens=(11, 12))):
        assert ModelShape.from_json(got.to_json()) == got
    with pytest.raises(ValueError, match=r"^the server's model shape is malformed \(KeyError: 'labels'\)"):
        ModelShape.from_json({"kind": "scalar", "architecture": "X"})
    with pytest.raises(ValueError, match=r"^the server's model shape must be a JSON object, got list"):
        ModelShape.from_json([])
