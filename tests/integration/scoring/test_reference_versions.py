"""A sample and its reference answer come from one weight version, while an online RM publishes new ones.

The manager is verl's (``load_reward_manager``) against the real weight-update server; new weights are real
publishes (seeded perturbations of the tiny RM). The fault proxy in front of the server places them exactly: it
publishes between two answers, and holds a request until a publish is done, so the publish lands between a
sample's request and its reference's. Which version answered shows in each score: the server's direct scores of the
same ids on that version.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fault_proxy import FaultProxy
from sync_helpers import load_rm, perturbed, reset_server, runtime_version, server_scores

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.weight_sync import RewardModelPublisher

pytestmark = pytest.mark.server

PROMPT, REFERENCE = "What is 3 + 4?", " The answer is 7."
SAMPLE = " The answer is 8."


@pytest.fixture(scope="module")
def server(ws_server, tiny_rm):
    """The weight-update server; it serves the on-disk RM again afterwards."""
    yield ws_server
    reset_server(ws_server.url, tiny_rm)


class Publisher:
    """Publishes new weights into the server (each a fresh perturbation of the tiny RM, version + 1)."""

    def __init__(self, url: str, rm_path: str) -> None:
        self.url, self.base, self.seed = url, load_rm(rm_path), 0

    def __call__(self) -> int:
        self.seed += 1
        with RewardModelPublisher(self.url, timeout_s=60) as pub:
            version = pub.version + 1
            pub.publish(perturbed(self.base, self.seed), version, "full")
        return version


@pytest.fixture()
def proxy(server):
    with FaultProxy(server.url) as proxy:
        yield proxy


def scored_ids(record: dict) -> list[list[int]]:
    return json.loads(record["body"])["input"]


def score_requests(proxy: FaultProxy) -> list[list[list[int]]]:
    return [scored_ids(r) for r in proxy.requests if r["path"] == "/score"]


def manager(load_manager, verl_config, tokenizer, url: str, **kwargs):
    return load_manager(verl_config(url, pairwise="always", max_length=512, **kwargs), tokenizer)


def batch(tokenizer, responses=(SAMPLE,)):
    group = Group(tokenizer(PROMPT).input_ids, [tokenizer(r).input_ids for r in responses], ground_truth=REFERENCE)
    return build_batch([group], tokenizer.pad_token_id)


def info_of(mgr, data) -> dict:
    return mgr(data, return_dict=True)["reward_extra_info"]


@pytest.fixture()
def ids(tokenizer) -> dict[str, list[int]]:
    """What the server scores for the sample and for the reference (prompt + answer tokens)."""
    prompt = tokenizer(PROMPT).input_ids
    return {"sample": prompt + tokenizer(SAMPLE).input_ids,
            "reference": prompt + tokenizer(REFERENCE, add_special_tokens=False).input_ids}


def test_without_a_publish_a_group_shares_one_reference(load_manager, verl_config, tokenizer, proxy):
    mgr = manager(load_manager, verl_config, tokenizer, proxy.url)
    version = runtime_version(proxy.url)
    info = info_of(mgr, batch(tokenizer, responses=(" 8.", " 9.")))
    assert info["rm_weight_version"] == [float(version)] * 2 and mgr.rm.references.scored == 1
    assert sum(len(r) for r in score_requests(proxy)) == 3  # two samples, one reference


def test_a_sample_older_than_its_reference_is_scored_again_on_the_new_version(load_manager, verl_config, tokenizer,
                                                                              proxy, tiny_rm, ids):
    publish = Publisher(proxy.upstream, tiny_rm)
    published = {}

    async def hold_the_reference(record: dict) -> None:
        if record["path"] == "/score" and ids["reference"] in scored_ids(record) and "version" not in published:
            published.setdefault("event", asyncio.Event())
            await published["event"].wait()  # until the sample's answer is back and the publish is done

    def publish_after_the_sample(record: dict) -> None:
        if record["path"] == "/score" and scored_ids(record) == [ids["sample"]] and "version" not in published:
            published["version"] = publish()
            published.setdefault("event", asyncio.Event()).set()

    proxy.faults.hold, proxy.faults.answered = hold_the_reference, publish_after_the_sample
    mgr = manager(load_manager, verl_config, tokenizer, proxy.url, whiten="running", max_batch_seqs=1)
    info = info_of(mgr, batch(tokenizer))
    new = published["version"]
    assert score_requests(proxy) == [[ids["sample"]], [ids["reference"]], [ids["sample"]]]  # the sample again
    assert info["rm_weight_version"] == [float(new)] and info["rm_weight_version_rm"] == [float(new)]
    assert info["rm_score_rm"][0] == pytest.approx(server_scores(proxy.upstream, [ids["sample"]])[0], abs=1e-6)
    assert mgr.rm.whitening.count == 1  # the whitening counts the sample once, with the answer it keeps
    assert mgr.rm.references.scored == 1 and info["win"][0] is not None


def test_a_reference_older_than_its_sample_is_scored_on_the_samples_version(load_manager, verl_config, tokenizer,
                                                                            proxy, tiny_rm, ids):
    """verl scores each trajectory as it finishes: a group's second sample comes after a publish, and the
    reference kept from its first is asked for again, on the new version."""
    mgr = manager(load_manager, verl_config, tokenizer, proxy.url)
    data = batch(tokenizer, responses=(SAMPLE, " The answer is 9."))  # one uid, one row per call
    first = info_of(mgr, data[0:1])
    new = Publisher(proxy.upstream, tiny_rm)()
    second = info_of(mgr, data[1:2])
    assert first["rm_weight_version"] == [float(new - 1)] and second["rm_weight_version"] == [float(new)]
    assert mgr.rm.references.scored == 2  # once per version
    reference_now = server_scores(proxy.upstream, [ids["reference"]])[0]
    assert second["ref_margin"][0] == pytest.approx(second["rm_score"][0] - reference_now, abs=1e-6)  # both on new
    assert sum(r.count(ids["reference"]) for r in score_requests(proxy)) == 2


def test_versions_that_never_meet_are_an_error_or_masked_by_the_failure_policy(load_manager, verl_config, tokenizer,
                                                                                proxy, tiny_rm):
    """A publish after every answer (one request at a time): the sample and its reference never share a version."""
    from verl_vllm_rm.scoring.rm_answers import ReferenceVersionError

    publish = Publisher(proxy.upstream, tiny_rm)

    def publish_after_every_answer(record: dict) -> None:
        if record["path"] == "/score":
            publish()

    proxy.faults.answered = publish_after_every_answer
    one_at_a_time = {"max_batch_seqs": 1, "max_concurrent_requests": 1}
    mgr = manager(load_manager, verl_config, tokenizer, proxy.url, **one_at_a_time)
    with pytest.raises(ReferenceVersionError, match=r"reward model 'rm': sample uid=.* and its reference answer came "
                                                    r"from different weight versions .* after 3 tries.*Publish less "
                                                    r"often \(online_rm.publish_every\)"):
        info_of(mgr, batch(tokenizer))
    masked = manager(load_manager, verl_config, tokenizer, proxy.url, failure_policy="mask", **one_at_a_time)
    info = info_of(masked, batch(tokenizer))
    assert info["rm_valid"] == [1.0] and info["win"] == [None]  # the sample keeps its score; no comparison


def test_a_reference_is_kept_per_group_and_version():
    from verl_vllm_rm.scoring.pairwise import ReferenceCache
    from verl_vllm_rm.scoring.reward_model import Scored

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
