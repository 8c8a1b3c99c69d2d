"""Score texts and token ids with VLLMRewardClient against a real vLLM reward server (CPU).

    .venv/bin/python examples/score_with_client.py
"""

import asyncio
import tempfile

from verl_vllm_rm.client.reward_client import VLLMRewardClient
from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.dev.tiny_rm import build_tiny_rm

TEXTS = ["What is 2 + 2? The answer is 4.", "What is 2 + 2? The answer is 5.", "so so so so"]


async def score(url: str) -> tuple[list[float], list[float], int]:
    """Raw scores, sigmoid-normalized scores and the server's weights version."""
    async with VLLMRewardClient(url, max_batch_seqs=2) as client:  # small budget: 2 requests per batch
        raw = await client.score_batch(TEXTS)
        for text, s in zip(TEXTS, raw):
            print(f"{s:+.4f}  {text}")
        normalized = await client.score_batch(TEXTS, normalize=True)
        print("normalized:", [round(p, 4) for p in normalized])
        version = await client.get_model_version()
        print("server version:", version)
    return raw, normalized, version


if __name__ == "__main__":
    model = build_tiny_rm(tempfile.mkdtemp() + "/tiny-rm")
    with running_server(model, ["--dtype", "float32", "--enforce-eager"]) as server:
        asyncio.run(score(server.url))
