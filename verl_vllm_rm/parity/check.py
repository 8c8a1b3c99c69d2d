"""``verl-vllm-rm check``: refit parity, embedding health and max_model_len on a live server."""

from __future__ import annotations

import asyncio
from typing import Any

from verl_vllm_rm.client.reward_client import RewardRequestError, VLLMRewardClient
from verl_vllm_rm.parity.embeddings import embedding_health
from verl_vllm_rm.parity.report import refit_parity
from verl_vllm_rm.protocol.score import longest_input
from verl_vllm_rm.client.length import fit_to_length


def probe_token_ids(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    from verl_vllm_rm.parity.corpus import synthetic_corpus

    return [tokenizer(line).input_ids for line in synthetic_corpus(n_lines=n, seed=seed)]


def check_max_model_len(client_factory, tokenizer_len: int) -> dict[str, Any]:
    """An input one token over ``max_model_len`` is refused; the left-truncated one is scored."""

    async def run():
        client = client_factory()
        try:
            max_len = longest_input(await client.health())
            over = [5] * (max_len + 1)
            try:
                await client.score_batch([over])
                refused = False
            except RewardRequestError:
                refused = True
            fitted, dropped = fit_to_length(over[:-8], over[-8:], max_len, "truncate_prompt_left")
            scored = len(await client.score_batch([fitted])) == 1
            return {"max_model_len": max_len, "overlong_refused": refused, "truncated_scored": scored,
                    "dropped": dropped, "ok": refused and scored and len(fitted) == max_len}
        finally:
            await client.close()

    return asyncio.run(run())


def run_check(url: str, model_path: str, *, probes: int = 64, threshold: float = 1.05, api_key: str | None = None,
              zero_norm: float = 1e-6, identical_tol: float = 0.0) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from verl_vllm_rm.parity.reference import load_reward_model, sequence_scores

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_reward_model(model_path)
    ids = probe_token_ids(tokenizer, probes)

    def client():
        return VLLMRewardClient(url, api_key=api_key)

    parity = refit_parity(client(), sequence_scores(model, ids), ids, threshold=threshold)
    ignore = (tokenizer.pad_token_id,) if tokenizer.pad_token_id is not None else ()
    embeddings = embedding_health(model, zero_norm=zero_norm, identical_tol=identical_tol, ignore_rows=ignore)
    length = check_max_model_len(client, len(tokenizer))
    report = {
        "server": url,
        "model": model_path,
        "parity": parity.as_dict(),
        "embeddings": [e.as_dict() for e in embeddings],
        "max_model_len": length,
    }
    report["ok"] = parity.ok and all(e.ok for e in embeddings) and length["ok"]
    return report
