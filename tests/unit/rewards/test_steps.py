"""Process-reward arithmetic: aggregations, the prompt's own step tags, token-level placement."""

import math

import pytest

from verl_vllm_rm.rewards.steps import aggregate_steps, response_steps, token_rewards

STEPS = [0.5, -2.0, 1.0]


@pytest.mark.parametrize(("method", "want"), [
    ("min", -2.0), ("last", 1.0), ("mean", -0.5 / 3),
    ("prod", (1 / (1 + math.exp(-0.5))) * (1 / (1 + math.exp(2.0))) * (1 / (1 + math.exp(-1.0)))),
])
def test_aggregations(method, want):
    assert aggregate_steps(STEPS, method, normalized=False) == pytest.approx(want)


def test_prod_of_probabilities_as_served_when_normalized():
    assert aggregate_steps([0.5, 0.8], "prod", normalized=True) == pytest.approx(0.4)


def test_no_step_is_nan_and_an_unknown_method_an_error():
    assert math.isnan(aggregate_steps([], "min", normalized=False))
    with pytest.raises(ValueError, match="'max' is not one of"):
        aggregate_steps(STEPS, "max", normalized=False)


def test_the_prompts_own_step_tags_are_left_out():
    # RM input: prompt [9, 4, 9] (one tag 9) + response [5, 9, 6, 9]; the server scored all three tags
    assert response_steps([0.1, 0.2, 0.3], [9, 4, 9, 5, 9, 6, 9][1:], 2, 9) == [0.2, 0.3]
    assert response_steps([0.1, 0.2, 0.3], [9, 4, 9, 5, 9, 6, 9], 3, 9) == [0.3]


def test_token_rewards_put_each_step_on_its_ending_token_and_the_rest_last():
    total_of = lambda r: 2.0 * (0.5 * r + 1.0)  # noqa: E731 (a gate of 2 over 0.5 * rubric + 1.0 of other components)
    rest = total_of(0.0)
    out = token_rewards(5, [1, 3], [0.4, -1.0], total_of(1.0) - rest, rest)
    assert out == pytest.approx([0.0, 0.4, 0.0, -1.0, 2.0])
    assert sum(out) == pytest.approx(total_of(0.4 - 1.0))
    # a token that ends two steps (the policy wrote both ends in one token) holds both; the last step on the last
    assert token_rewards(3, [1, 1, 2], [0.25, 0.5, 1.0], 1.0, 0.125) == pytest.approx([0.0, 0.75, 1.125])


def test_token_rewards_refuse_steps_that_do_not_match_the_tokens():
    with pytest.raises(ValueError, match="2 step scores for 1 step-ending tokens in the response"):
        token_rewards(3, [1], [0.4, -1.0], 1.0, 0.0)
