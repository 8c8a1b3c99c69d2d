"""The ``judge`` component in the manager, on the session's reward server and a real vLLM-CPU judge: each group
judged once with all its members, on the batch path and through verl's reward loop with two Ray workers and
shuffled rows; a member that never arrives, a judge that cannot be reached and an answer cut short each go
through the judge's failure policy, never a silent number."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from ray_helpers import start_local_ray

from verl_vllm_rm.dev.grpo_batch import build_batch
from verl_vllm_rm.dev.loader import load_manager, vllm_rm_config

N = 4  # responses per prompt in grpo_groups
SHUFFLED = np.array([0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15])  # every group on both workers


def judge_kwargs(url: str, **judge) -> dict:
    return {"rewards": {"components": ["rubric", "judge"], "weights": {"rubric": 1.0, "judge": 0.5}},
            "judge": {"server_url": [url], "mode": "listwise", "group_size": N, "temperature": 1.0, **judge},
            "num_examine": 100}


def by_group(out: dict, uids) -> dict[str, list[dict]]:
    info = out["reward_extra_info"]
    rows = [{k: info[k][i] for k in info} for i in range(len(uids))]
    groups: dict[str, list[dict]] = {}
    for uid, row in zip(uids, rows):
        groups.setdefault(uid, []).append(row)
    return groups


def check_listwise_groups(groups: dict[str, list[dict]]) -> None:
    """Every member of a group carries the same one answer, a permutation of the group, and its own rank."""
    for members in groups.values():
        assert len(members) == N and len({m["judge_answer"] for m in members}) == 1
        ranking = [k - 1 for k in json.loads(members[0]["judge_answer"])["ranking"]]
        assert sorted(ranking) == list(range(N))
        assert sorted(m["judge_rank"] for m in members) == [0.0, 1.0, 2.0, 3.0]
        for m in members:
            assert m["judge_valid"] == 1.0
            assert m["judge_score"] == pytest.approx(1 - 2 * m["judge_rank"] / (N - 1))
            assert m["score"] == pytest.approx(m["rm_score"] + 0.5 * m["judge_score"], abs=1e-6)


def test_batch_call_judges_each_group_once_with_all_members(rm_server, judge_server, tokenizer, tiny_rm,
                                                            grpo_groups):
    """Each group judged once; each member's judge_rank is the rank the judge's own answer gave that member's
    response (read from what a recording proxy passed between manager and judge), not just a permutation."""
    from fault_proxy import FaultProxy
    from judge_answers import assert_ranks_are_the_judges

    with FaultProxy(judge_server.url) as proxy:
        mgr = load_manager(tokenizer, rm_server.url, tiny_rm, judge_kwargs(proxy.url))
        try:
            data = build_batch(grpo_groups, tokenizer.pad_token_id)
            out = mgr(data, return_dict=True)
            groups = by_group(out, data.non_tensor_batch["uid"])
            check_listwise_groups(groups)
            stats = mgr.judge._local.stats
            assert stats.groups_judged == len(grpo_groups) and set(stats.judged_sizes.values()) == {N}
        finally:
            mgr.close()
    texts = [tokenizer.decode(r, skip_special_tokens=True) for g in grpo_groups for r in g.response_ids]
    ranks = out["reward_extra_info"]["judge_rank"]
    by_uid: dict[str, list[tuple[str, float]]] = {}
    for uid, text, rank in zip(data.non_tensor_batch["uid"], texts, ranks):
        by_uid.setdefault(uid, []).append((text, rank))
    assert len(by_uid) == len(grpo_groups)
    for members in by_uid.values():
        assert_ranks_are_the_judges(members, proxy.requests)


@pytest.fixture(scope="module")
def ray_two_workers():
    import ray

    start_local_ray(num_cpus=4, ignore_reinit_error=True)
    yield
    ray.shutdown()


def test_two_ray_workers_and_shuffled_rows_judge_each_group_once(ray_two_workers, rm_server, judge_server, tiny_rm,
                                                                 tokenizer, grpo_groups):
    """verl sends each row to one of its two workers: members of every group reach both, and still each group
    is judged once with all four members (the rendezvous actor's record), the group size taken from verl's
    ``actor_rollout_ref.rollout.n`` (``val_kwargs.n`` in validation)."""
    import ray
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    from verl_vllm_rm.judge.rendezvous import RENDEZVOUS_ACTOR
    from verl_vllm_rm.rows import VALIDATION_FIELD

    kwargs = judge_kwargs(judge_server.url)
    del kwargs["judge"]["group_size"]
    cfg = vllm_rm_config(rm_server.url, tiny_rm, kwargs, ["reward.num_workers=2", f"actor_rollout_ref.rollout.n={N}",
                                                          "actor_rollout_ref.rollout.val_kwargs.n=2"])
    manager = RewardLoopManager(cfg)
    assert len(manager.reward_loop_workers) == 2
    data = build_batch(grpo_groups, tokenizer.pad_token_id)[SHUFFLED]
    out = manager.compute_rm_score(data)
    info = {k: out.non_tensor_batch[k].tolist() for k in out.meta_info["reward_extra_keys"]}
    check_listwise_groups(by_group({"reward_extra_info": info}, data.non_tensor_batch["uid"].tolist()))
    stats = ray.get(ray.get_actor(RENDEZVOUS_ACTOR).stats_dict.remote())
    assert stats["groups_judged"] == len(grpo_groups) and stats["groups_expired"] == 0
    assert sorted(stats["judged_sizes"]) == sorted(set(data.non_tensor_batch["uid"].tolist()))
    assert set(stats["judged_sizes"].values()) == {N}

    # validation: verl's per-row calls drop its validate flag; our trainer modes tag each validation prompt
    # (VALIDATION_FIELD, carried with the prompt's fields), and groups then hold val_kwargs.n members (2 here: the
    # first two responses of each prompt)
    val = build_batch([dataclasses.replace(g, response_ids=g.response_ids[:2]) for g in grpo_groups],
                      tokenizer.pad_token_id)
    val.non_tensor_batch[VALIDATION_FIELD] = np.array([True] * len(val), dtype=object)
    out = manager.compute_rm_score(val[np.array([0, 2, 4, 6, 1, 3, 5, 7])])
    assert out.non_tensor_batch["judge_valid"].tolist() == [1.0] * len(val)
    assert sorted(out.non_tensor_batch["judge_rank"].tolist()) == [0.0] * 4 + [1.0] * 4
    stats = ray.get(ray.get_actor(RENDEZVOUS_ACTOR).stats_dict.remote())
    assert stats["groups_judged"] == 2 * len(grpo_groups) and stats["groups_expired"] == 0
    assert sorted(v for k, v in stats["judged_sizes"].items() if k in set(val.non_tensor_batch["uid"])) == [2] * 4


def missing_member_batch(grpo_groups, tokenizer):
    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    return data[np.arange(1, len(data))]  # the first group lost its first member


def test_a_member_that_never_arrives_fails_its_group_under_raise(rm_server, judge_server, tokenizer, tiny_rm,
                                                                 grpo_groups):
    from verl_vllm_rm.judge.reward import JudgeError

    mgr = load_manager(tokenizer, rm_server.url, tiny_rm, judge_kwargs(judge_server.url, group_timeout_s=2.0))
    try:
        with pytest.raises(JudgeError, match=r"the judge failed for training sample uid=\S+, group size 4 "
                                             r"\(judge\.failure_policy is raise; mask drops the judge's part of these "
                                             r"samples instead; .*\): .*has 3 of its 4 members (\d+\.\d)s after the "
                                             r"first arrived .*a member never came") as err:
            mgr(missing_member_batch(grpo_groups, tokenizer))
    finally:
        mgr.close()
    waited = float(re.search(r"members (\d+\.\d)s after", str(err.value)).group(1))
    assert waited >= 2.0  # group_timeout_s passed before it gave up (how much later, a loaded machine decides)


def test_a_member_that_never_arrives_masks_its_group_under_mask(rm_server, judge_server, tokenizer, tiny_rm,
                                                                grpo_groups):
    mgr = load_manager(tokenizer, rm_server.url, tiny_rm,
                       judge_kwargs(judge_server.url, group_timeout_s=2.0, failure_policy="mask"))
    try:
        data = missing_member_batch(grpo_groups, tokenizer)
        out = mgr(data, return_dict=True)
        groups = by_group(out, data.non_tensor_batch["uid"])
        incomplete = [m for m in groups.values() if len(m) == N - 1]
        assert len(incomplete) == 1
        for m in incomplete[0]:
            assert (m["judge_valid"], m["judge_score"], m["score"]) == (0.0, None, 0.0)
        assert mgr.judge.failed == N - 1
        for members in groups.values():
            if len(members) == N:
                assert all(m["judge_valid"] == 1.0 for m in members)
        assert mgr.last_batch_stats["reward/judge_valid/mean"] == pytest.approx(12 / 15)
    finally:
        mgr.close()


@pytest.mark.parametrize("judge, cause", [
    ({"max_tokens": 4}, "cut at max_tokens"),
    ({"server_url": ["http://127.0.0.1:9"], "max_retries": 1, "backoff_base_s": 0.01},
     r"failed after 2 attempt\(s\), max_retries 1 used up"),
    ({"read_timeout_s": 0.3, "max_retries": 1, "backoff_base_s": 0.01}, r"failed after 2 attempt.*timed out"),
], ids=["answer-cut-short", "judge-unreachable", "judge-times-out"])
def test_a_failed_judgement_goes_through_the_failure_policy(rm_server, judge_server, tokenizer, tiny_rm, grpo_groups,
                                                            judge, cause):
    """Each failure under ``raise`` stops the batch naming it, under ``mask`` every sample of the failed groups is
    masked and counted. The slow judge is the real one behind a proxy that delays each answer by 5 s."""
    from fault_proxy import FaultProxy

    from verl_vllm_rm.judge.reward import JudgeError

    data = build_batch(grpo_groups, tokenizer.pad_token_id)
    with FaultProxy(judge_server.url) as proxy:
        proxy.faults.delay_s = 5.0 if "read_timeout_s" in judge else 0.0
        for policy in ("raise", "mask"):
            mgr = load_manager(tokenizer, rm_server.url, tiny_rm,
                               judge_kwargs(proxy.url, failure_policy=policy, **judge))
            try:
                if policy == "raise":
                    with pytest.raises(JudgeError, match=cause):
                        mgr(data)
                    continue
                out = mgr(data, return_dict=True)
                assert out["reward_extra_info"]["judge_valid"] == [0.0] * len(data)
                assert out["reward_extra_info"]["score"] == [0.0] * len(data)  # masked and counted: never a number
                assert mgr.judge.failed == len(data)
            finally:
                mgr.close()
