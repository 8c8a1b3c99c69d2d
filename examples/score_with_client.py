"""Score texts and token ids with VLLMRewardClient against a real vLLM reward server (CPU).

    .venv/bin/python examples/score_with_client.py
"""

import asyncio
import tempfile

from verl_vllm_rm.client import VLLMRewardClient
from verl_vllm_rm.server_process import running_server
from verl_vllm_rm.tiny_rm import build_tiny_rm


async def score(url: str) -> None:
    async with VLLMRewardClient(url, max_batch_seqs=2) as client:  # small budget: 3 requests below
        texts = ["What is 2 + 2? The answer is 4.", "What is 2 + 2? The answer is 5.", "so so so so"]
        for text, s in zip(texts, await client.score_batch(texts)):
            print(f"{s:+.4f}  {text}")
        print("normalized:", [round(p, 4) for p in await client.score_batch(texts, normalize=True)])
        print("server version:", await client.get_model_version())


if __name__ == "__main__":
    model = build_tiny_rm(tempfile.mkdtemp() + "/tiny-rm")
    with running_server(model, ["--dtype", "float32", "--enforce-eager"]) as server:
        asyncio.run(score(server.url))
