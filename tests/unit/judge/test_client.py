"""The generative judge's client (``judge/client.py``) where no judge answers: what it refuses before any request,
an unreachable judge, and how it reads a reply (the judge on a real server:
tests/integration/judge/test_client.py)."""

from __future__ import annotations

import pytest
from judge_calls import judge

from verl_vllm_rm.client.reward_client import RewardServerError
from verl_vllm_rm.judge.client import _completion
from verl_vllm_rm.rewards.judge import JudgeAnswerError


def test_an_unreachable_judge_fails_naming_the_server(dead_url):
    with pytest.raises(RewardServerError, match=dead_url.removeprefix("http://")):
        judge(dead_url, mode="listwise", max_retries=1, backoff_base_s=0.01)


def test_groups_a_mode_cannot_judge_are_refused_before_any_request(dead_url):
    with pytest.raises(ValueError, match="a listwise judge ranks at most 12 responses, this group has 13"):
        judge(dead_url, responses=[str(k) for k in range(13)], mode="listwise")
    with pytest.raises(ValueError, match="pairwise_against=reference needs the prompt's reference answer"):
        judge(dead_url, reference=None, mode="pairwise")


def test_a_chat_completion_gives_its_answer_text_and_prompt_tokens():
    body = {"choices": [{"message": {"content": '{"score": 7}'}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 41, "completion_tokens": 6}}
    assert _completion(body) == ('{"score": 7}', 41)
    assert _completion({"choices": [{"message": {"content": "x"}}]}) == ("x", 0)  # no usage, no finish reason


@pytest.mark.parametrize("body, error", [
    ({"object": "text_completion", "choices": [{"text": "7"}]},
     r"the judge's reply is not a chat completion: \{\"object\": \"text_completion\", .*; judge\.server_url must be "
     r"an OpenAI-compatible server answering /v1/chat/completions"),
    ({"choices": []}, r"the judge's reply is not a chat completion: \{\"choices\": \[\]\}"),
    ({"choices": [{"message": {"content": "7"}}], "usage": {"prompt_tokens": "many"}},
     r"the judge's reply is not a chat completion"),
    ({"choices": [{"message": {"content": None, "reasoning_content": "..."}}]},
     r"the judge's reply has no answer text \(message\.content\): .*; a reasoning or tool-call parser on the judge "
     r"server moves the answer out of it: serve the judge without one"),
    ({"choices": [{"message": {"content": '{"sco'}, "finish_reason": "length"}]},
     r"the judge's answer was cut at max_tokens \(raise the judge's max_tokens\): '\{\"sco'"),
])
def test_a_reply_that_is_not_a_whole_chat_answer_is_an_answer_error(body, error):
    with pytest.raises(JudgeAnswerError, match=error):
        _completion(body)


def test_the_quoted_reply_is_cut_at_200_characters():
    with pytest.raises(JudgeAnswerError) as refused:
        _completion({"detail": "x" * 500})
    quoted = str(refused.value).split("not a chat completion: ", 1)[1].split("; judge.server_url", 1)[0]
    assert quoted == ('{"detail": "' + "x" * 500)[:200]
