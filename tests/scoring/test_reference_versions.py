"""A sample and its reference answer come from one weight version, while an online RM publishes new ones.

The manager is verl's (``load_reward_manager``); its RM's group batcher is replaced by a stand-in server that
answers each request on the version it serves when it answers, and publishes after chosen answers, so a publish
lands exactly between a sample's request and its reference's. Scores: the ids' sum / 100 plus 10 x the version,
so which version answered shows in every score.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.scoring.reward_model import Scored

PROMPT, REFERENCE = "What is 3 + 4?", " The answer is 7."


class PublishingServer:
    """An RM's group batcher: answers on the version served at answer time; publishes after the answers counted
    in ``publish_after`` (1-based); ``delays``: seconds before answering the n-th request (0-based)."""

    def __init__(self, publish_after=(), delays=None) -> None:
        self.version, self.answered, self.requests = 0, 0, 0
        self.publish_after, self.delays = set(publish_after), dict(delays or {})

    def submit(self, group_key, ids) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(self.delays.get(self.requests, 0.0), self._answer, future, list(ids))
        self.requests += 1
        return future

    def _answer(self, future: asyncio.Future, ids: list[int]) -> None:
        future.set_result(Scored(sum(ids) / 100 + 10 * self.version, self.version, time.perf_counter()))
        self.answered += 1
        if self.answered in self.publish_after or "every" in self.publish_after:
            self.version += 1

    def flush(self) -> None:
        pass

    async def cancel_in_flight(self) -> None:
        pass


def score(load_manager, verl_config, tokenizer, server: PublishingServer, responses=(" The answer is 8.",),
          **kwargs) -> tuple[dict, object]:
    mgr = load_manager(verl_config("http://127.0.0.1:1", pairwise="always", max_length=512, **kwargs), tokenizer)
    mgr.rm.batcher = server
    group = Group(tokenizer(PROMPT).input_ids, [tokenizer(r).input_ids for r in responses],
                  ground_truth=REFERENCE)
    return mgr(build_batch([group], tokenizer.pad_token_id), return_dict=True)["reward_extra_info"], mgr


def test_without_a_publish_a_group_shares_one_reference(load_manager, verl_config, tokenizer):
    info, mgr = score(load_manager, verl_config, tokenizer, PublishingServer(), responses=(" 8.", " 9."))
    assert info["rm_weight_version"] == [0.0, 0.0] and mgr.rm.references.scored == 1
    assert mgr.rm.batcher.requests == 3  # two samples, one reference


def test_a_sample_older_than_its_reference_is_scored_again_on_the_new_version(load_manager, verl_config, tokenizer):
    server = PublishingServer(publish_after={1})  # the sample answered on 0, then a publish, the reference on 1
    info, mgr = score(load_manager, verl_config, tokenizer, server, whiten="running")
    assert server.requests == 3  # sample, reference, the sample again
    assert info["rm_weight_version"] == [1.0] and info["rm_weight_version_rm"] == [1.0]
    assert info["rm_score_rm"][0] >= 10  # the new version's score, not the first answer's
    assert mgr.rm.whitening.count == 1  # the whitening counts the sample once, with the answer it keeps
    assert mgr.rm.references.scored == 1 and info["win"][0] is not None


def test_a_reference_older_than_its_sample_is_scored_on_the_samples_version(load_manager, verl_config, tokenizer):
    # the sample's answer comes late: the reference is answered on 0, a publish, then the sample on 1
    server = PublishingServer(publish_after={1}, delays={0: 0.05})
    info, mgr = score(load_manager, verl_config, tokenizer, server)
    assert info["rm_weight_version"] == [1.0] and server.requests == 3  # the sample once, the reference twice
    assert mgr.rm.references.scored == 2  # once per version
    ids = tokenizer(PROMPT).input_ids + tokenizer(REFERENCE, add_special_tokens=False).input_ids
    assert info["ref_margin"][0] == pytest.approx(info["rm_score"][0] - (sum(ids) / 100 + 10))  # both on 1


def test_versions_that_never_meet_are_an_error_or_masked_by_the_failure_policy(load_manager, verl_config, tokenizer):
    from verl_vllm_rm.scoring.rm_answers import ReferenceVersionError

    with pytest.raises(ReferenceVersionError, match=r"reward model 'rm': sample uid=.* and its reference answer came "
                                                    r"from different weight versions .* after 3 tries.*Publish less "
                                                    r"often \(online_rm.publish_every\)"):
        score(load_manager, verl_config, tokenizer, PublishingServer(publish_after={"every"}))
    info, _ = score(load_manager, verl_config, tokenizer, PublishingServer(publish_after={"every"}),
                    failure_policy="mask")
    assert info["rm_valid"] == [1.0] and info["win"] == [None]  # the sample keeps its score; no comparison


def test_a_reference_is_kept_per_group_and_version():
    from verl_vllm_rm.scoring.pairwise import ReferenceCache

    cache, asked = ReferenceCache(max_entries=2), []

    def request(version: int):
        def make():
            asked.append(version)
            future = asyncio.get_running_loop().create_future()
            future.set_result(Scored(float(version), version, 0.0))
            return future
        return make

    async def go():
        assert (await cache.score("g", request(0))).version == 0
        assert (await cache.score("g", request(9))).version == 0  # any version: the newest kept, not asked again
        assert (await cache.score("g", request(0), version=0)).version == 0
        assert (await cache.score("g", request(1), version=1)).version == 1  # another version: asked
        assert (await cache.score("g", request(9))).version == 1
        shared = await asyncio.gather(cache.score("h", request(2), 2), cache.score("h", request(9), 2))
        assert [a.version for a in shared] == [2, 2]  # one request in flight, shared
        await cache.score("k", request(3))
        await asyncio.sleep(0)  # its answer kept (the request's done-callback): a third key, the oldest ("g") goes
        assert (await cache.score("g", request(4), version=0)).version == 4

    asyncio.run(go())
    assert asked == [0, 1, 2, 3, 4] and cache.scored == 5
