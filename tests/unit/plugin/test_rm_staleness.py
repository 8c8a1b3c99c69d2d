"""``+online_rm.max_staleness`` (``plugin/rm_staleness.py``): verl's own asynchronous replay buffer, evicting groups
scored by the trained RM below the floor: the in-process tests (no server; those on the real server: tests/integration/plugin/test_rm_staleness.py)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from staleness_buffers import make_buffer

from verl_vllm_rm.options import ConfigError


class FakeQueue:
    """The three TransferQueue calls verl's replay buffer and this package's make, on one dict (uids without "_": verl
    splits trajectory keys on it)."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, dict]] = defaultdict(dict)  # partition -> key -> tag
        self.fields: dict[str, dict] = {}  # key -> {"extra_fields": ...}
        self.cleared: list[str] = []

    def finish_group(self, uid: str, versions: list, global_steps: int = 1, key: str = "rm_weight_version",
                     status: str = "finished") -> None:
        self.items["train"][uid] = {"is_prompt": True, "status": status, "global_steps": global_steps}
        for session, version in enumerate(versions):
            self.items["train"][f"{uid}_{session}_0"] = {"status": "success", "global_steps": global_steps}
            self.fields[f"{uid}_{session}_0"] = {"extra_fields": {"reward_extra_info": {key: version}}}

    def kv_list(self, partition_id: str | None = None):
        return {p: dict(items) for p, items in self.items.items() if partition_id in (None, p)}

    def kv_batch_get(self, keys, partition_id, select_fields):
        return {field: [self.fields[key][field] for key in keys] for field in select_fields}

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.items[partition_id].pop(key, None)
        self.cleared += list(keys)


@pytest.fixture
def fake_queue(monkeypatch):
    from verl.trainer.ppo.v1 import replay_buffer

    from verl_vllm_rm.plugin import rm_staleness

    fake = FakeQueue()
    monkeypatch.setattr(replay_buffer, "tq", fake)
    monkeypatch.setattr(rm_staleness, "tq", fake)
    return fake


def test_a_trajectorys_version_is_the_trained_rms_oldest_and_a_groups_its_oldest():
    from verl_vllm_rm.plugin.rm_staleness import oldest_per_group, trajectory_versions

    infos = [{"a": 3.0, "b": 5.0}, {"a": None, "b": 4.0}, {"a": -1.0, "b": None}, {"a": 7.0, "b": 7.0}]
    versions = trajectory_versions(infos, ["a", "b"])
    assert np.array_equal(versions, [3.0, 4.0, np.nan, 7.0], equal_nan=True)  # masked (-1, None): no version
    assert oldest_per_group(["g", "h", "h", "k"], versions) == {"g": 3.0, "h": 4.0, "k": 7.0}
    assert oldest_per_group(["g"], np.array([np.nan])) == {"g": np.inf}  # never scored by it: never stale
    assert trajectory_versions([], ["a"]).shape == (0,)


def test_groups_scored_below_the_floor_are_evicted_counted_and_refilled(fake_queue):
    refills = []
    buffer = make_buffer(max_staleness=2, refills=refills)
    for uid, versions in {"old": [3.0, 4.0], "edge": [4.0, 4.0], "new": [5.0, 5.0], "masked": [-1.0, -1.0]}.items():
        fake_queue.finish_group(uid, versions)
    assert buffer.get_sampleable_count(1, "train") == 4  # nothing published yet: no floor
    buffer.published(5)
    assert buffer.floor == 4
    batch, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=3)
    assert metrics == {"training/rm_staleness/evicted_samples": 1}  # groups, as verl counts its own evictions
    assert refills == [1]  # verl's refill: one prompt per evicted group
    assert {"old", "old_0_0", "old_1_0"} <= set(fake_queue.cleared)  # the prompt and its trajectories
    assert sorted({key.split("_")[0] for key in batch.keys}) == ["edge", "masked", "new"]
    versions = [fake_queue.fields[key]["extra_fields"]["reward_extra_info"]["rm_weight_version"] for key in batch.keys]
    scored = [v for v in versions if v >= 0]
    assert max(scored) - min(scored) + 1 <= buffer.max_staleness  # the batch spans at most max_staleness versions


def test_a_group_verl_evicts_for_its_own_reason_is_counted_there_once(fake_queue):
    refills = []
    buffer = make_buffer(max_staleness=1, refills=refills, max_off_policy_threshold=2)
    fake_queue.finish_group("both", [1.0], global_steps=1)  # past verl's off-policy threshold at step 5, RM-stale
    fake_queue.finish_group("failed", [9.0], status="failure")
    fake_queue.finish_group("rmstale", [1.0], global_steps=5)
    fake_queue.finish_group("fresh", [9.0], global_steps=5)
    buffer.published(9)
    sampleable, metrics = buffer.wait_for_sampleable(5, "train", 1)
    assert sampleable == {"fresh"}
    assert metrics["training/off_policy/evicted_samples"] == 1
    assert metrics["training/rollout_failure/evicted_samples"] == 1
    assert metrics["training/rm_staleness/evicted_samples"] == 1
    assert refills == [3]


def test_groups_restored_on_resume_are_evicted_whatever_their_version(fake_queue):
    """The server before a restart counted versions of its own: a restored group's version says nothing."""
    refills = []
    buffer = make_buffer(max_staleness=3, refills=refills)
    fake_queue.finish_group("restored", [7.0])
    assert buffer.retire_finished_groups() == 1
    buffer.published(1)  # the resumed RM, published to a restarted server
    fake_queue.finish_group("fresh", [1.0])
    sampleable, metrics = buffer.wait_for_sampleable(1, "train", 1)
    assert sampleable == {"fresh"} and metrics == {"training/rm_staleness/evicted_samples": 1} and refills == [1]
    assert buffer.get_sampleable_count(1, "train") == 1  # evicted once, not again


def test_validation_groups_are_never_evicted(fake_queue):
    buffer = make_buffer(max_staleness=1)
    fake_queue.items["val"]["v"] = {"is_prompt": True, "status": "finished", "global_steps": 1}
    fake_queue.items["val"]["v_0_0"] = {"status": "success"}
    buffer.published(10)
    batch, metrics = buffer.sample(global_steps=1, partition_id="val", batch_size=1)
    assert batch.keys == ["v_0_0"] and metrics == {}


def test_rewards_without_the_version_are_named(fake_queue):
    buffer = make_buffer()
    fake_queue.finish_group("g", [1.0], key="acc")
    buffer.published(1)
    with pytest.raises(ConfigError, match=r"reads each trajectory's RM weight version from reward_extra_info "
                                          r"\['rm_weight_version'\], and finished groups \['g'\] have none"):
        buffer.get_sampleable_count(1, "train")


def rm(name: str, **kwargs):
    from verl_vllm_rm.options import build
    from verl_vllm_rm.scoring.options import RewardModelOptions

    return build(RewardModelOptions, {"name": name, **kwargs}, "reward_models[0]")


@pytest.mark.parametrize(("rms", "online", "keys"), [
    ([rm("rm", server_url=["http://a:1"])], {"server_url": "http://a:1"}, ("rm_weight_version",)),
    ([rm("rm", server_url=["http://a:1"], whiten="running")], {"server_url": "http://a:1"},
     ("rm_weight_version_rm",)),
    ([rm("helpful", server_url=["http://a:1"]), rm("safety", server_url=["http://b:1"])],
     {"server_url": "http://b:1"}, ("rm_weight_version_safety",)),  # not the ensemble's oldest
    ([rm("w1", server_url=["http://a:1"]), rm("w2", server_url=["http://a:1"]), rm("x", server_url=["http://b:1"])],
     {"server_url": "http://a:1"}, ("rm_weight_version_w1", "rm_weight_version_w2")),  # one server read twice
])
def test_the_version_read_is_the_trained_rms_own(rms, online, keys):
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.plugin.rm_staleness import trained_rm_version_keys

    assert trained_rm_version_keys(rms, OnlineRMConfig(model_path="/rm", **online)) == keys


def test_an_online_rm_no_reward_model_is_served_by_is_named():
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.plugin.rm_staleness import trained_rm_version_keys

    online = OnlineRMConfig(model_path="/rm", server_url="http://c:1")
    with pytest.raises(ConfigError, match=r"no reward model of reward.reward_kwargs is served by what online_rm "
                                          r"trains \(online_rm.server_url=\['http://c:1'\]; the manager's: "
                                          r"\{'rm': \['http://a:1'\]"):
        trained_rm_version_keys([rm("rm", server_url=["http://a:1"])], online)
    with pytest.raises(ConfigError, match="none: reward.reward_manager.name is not vllm_rm"):
        trained_rm_version_keys([], online)
