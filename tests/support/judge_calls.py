"""A generative judge call on one prompt and its responses, as the judge client's tests make it."""

from __future__ import annotations

import asyncio

from verl_vllm_rm.judge.client import JudgeClient
from verl_vllm_rm.judge.options import JudgeOptions
from verl_vllm_rm.options import build

PROMPT = "What is 12 + 30?"
RESPONSES = ["42.", "It is 42 because 12 + 30 = 42.", "41", "I cannot say.", "Forty-two.", "12 + 30 = 43"]


def judge(url: str, prompt: str = PROMPT, responses=RESPONSES, reference: str | None = "42", **options):
    async def go():
        client = JudgeClient(build(JudgeOptions, {"server_url": [url], **options}, "judge"))
        try:
            return await client.judge_group(prompt, responses, reference)
        finally:
            await client.close()

    return asyncio.run(go())
