"""Weight updates while the ``vllm_rm`` manager scores under load (real verl loader, real server).

Two managers (two reward workers, each on its own thread and event loop) score the same GRPO
batch in a loop while the trainer publishes three new full versions. Every reward
must be one a single weight version produces for its row, the rows of a group (one
request) must share that version, versions never go back within a worker, and no
request is lost: every call returns every row, valid.
"""

from __future__ import annotations

import asyncio
import threading
import time

import torch
from sync_helpers import PARITY_ATOL, load_rm, perturbed, reset_server

from verl.trainer.ppo.reward import load_reward_manager
from verl_vllm_rm.dev.grpo_batch import build_batch, last_token_rewards, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.weight_sync import RewardModelPublisher

WORKERS = 2
JOIN_S = 120.0


def test_updates_under_manager_load_never_mix_or_lose(ws_server, tiny_rm, verl_config, tokenizer, grpo_groups):
    reset_server(ws_server.url, tiny_rm)
    base = load_rm(tiny_rm)
    states = [base] + [perturbed(base, seed) for seed in (11, 12, 13)]
    rows = [row_token_ids(g, r) for g in grpo_groups for r in g.response_ids]
    expected = torch.tensor([sequence_scores(m, rows) for m in states])  # [version, row]
    group_of = torch.tensor([i for i, g in enumerate(grpo_groups) for _ in g.response_ids])
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    results: list[list[torch.Tensor]] = [[] for _ in range(WORKERS)]
    errors: list[BaseException] = []
    stop = threading.Event()

    config = verl_config(ws_server.url)

    def work(i: int) -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())  # verl's manager runs on the thread's loop
        try:
            mgr = load_reward_manager(config, tokenizer)
        except BaseException as e:
            errors.append(e)
            return
        try:
            while not stop.is_set():
                out = mgr(data, return_dict=True)
                assert out["reward_extra_info"]["rm_valid"] == [1.0] * len(data), "a request was lost"
                results[i].append(last_token_rewards(out["reward_tensor"], data))
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            mgr.close()

    def one_more_round() -> None:
        seen = [len(r) for r in results]
        while not errors and any(t.is_alive() for t in threads) and any(
            len(r) <= s for r, s in zip(results, seen)
        ):
            time.sleep(0.01)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(WORKERS)]
    for t in threads:
        t.start()
    one_more_round()
    with RewardModelPublisher(ws_server.url, timeout_s=60, bucket_bytes=128 << 10) as pub:
        for model in states[1:]:
            pub.publish(model, pub.version + 1, "full")
            one_more_round()
    one_more_round()  # a call in flight during the last commit may end that round: this one started after it
    stop.set()
    for t in threads:
        t.join(JOIN_S)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads)

    for calls in results:
        versions_seen = []
        for rewards in calls:
            match = (rewards[None, :] - expected).abs() <= PARITY_ATOL  # [version, row]
            assert match.any(0).all(), f"a reward matches no weight version: {rewards.tolist()}"
            row_version = match.float().argmax(0)
            for g in range(len(grpo_groups)):
                in_group = match[:, group_of == g].all(1)
                assert in_group.any(), f"group {g} was scored with a mix of weight versions"
            versions_seen.append(int(row_version.max()))
        assert versions_seen == sorted(versions_seen), "a worker saw the weights go back"
        assert versions_seen[0] == 0 and versions_seen[-1] == len(states) - 1
