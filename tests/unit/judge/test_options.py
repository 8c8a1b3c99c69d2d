"""The generative judge's options (``judge/options.py``, ``reward_kwargs.judge``): what they refuse, naming the
option, and where the client's keys go."""

from __future__ import annotations

import pytest

from verl_vllm_rm.judge.options import JudgeOptions
from verl_vllm_rm.options import build


@pytest.mark.parametrize("options, error", [
    ({"mode": "ranked"}, r"judge.mode='ranked' is not one of \['pointwise', 'pairwise', 'listwise'\]"),
    ({"aggregation": "borda"}, r"judge.aggregation='borda' is not one of \['winrate', 'copeland', 'elo'\]"),
    ({"group_size": 0}, "judge group_size must be >= 1"),
    ({"group_timeout_s": 0.0}, "group_timeout_s must be > 0"),
    ({"template": "Judge {response}"}, r"must use \{prompt\} and \{responses\}.*unknown \['response'\]"),
    ({"max_tokens": 0}, "judge max_tokens must be > 0"),
    ({"temperature": -1.0}, "judge temperature must be >= 0"),
    ({"server_url": ["judge:8000"]}, "must start with http:// or https://"),
])
def test_bad_options_are_refused_naming_the_option(options, error):
    from verl_vllm_rm.options import ConfigError

    with pytest.raises(ConfigError, match=error):
        build(JudgeOptions, options, "judge")


def test_the_client_keys_sit_at_the_judges_level_and_the_rest_keep_their_defaults():
    opts = build(JudgeOptions, {"server_url": ["http://judge:8000"], "read_timeout_s": 3, "mode": "pointwise"},
                 "judge")
    assert opts.client.server_url == ["http://judge:8000"] and opts.client.read_timeout_s == 3.0
    assert (opts.mode, opts.pairwise_against, opts.aggregation, opts.failure_policy) == (
        "pointwise", "reference", "winrate", "raise")
    assert (opts.max_tokens, opts.temperature, opts.group_size, opts.group_timeout_s) == (128, 0.0, None, 600.0)
    assert len(opts.principles) == 3 and opts.principles[0].startswith("Helpfulness: ")


def test_a_template_may_use_only_its_modes_fields_and_must_use_prompt_and_responses():
    listwise = "Rank these {n}: {prompt} {responses} by {principles}"
    assert JudgeOptions(mode="listwise", template=listwise).template == listwise
    with pytest.raises(ValueError, match=r"judge template for mode 'pointwise' must use \{prompt\} and \{responses\} "
                                         r"and may use \['principles'\]; unknown \['n'\], missing \[\]"):
        JudgeOptions(mode="pointwise", template=listwise)
    with pytest.raises(ValueError, match=r"unknown \[\], missing \['responses'\]"):
        JudgeOptions(template="Judge {prompt}")
