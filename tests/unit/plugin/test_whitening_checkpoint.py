"""The whitening statistics of verl's reward-loop workers, saved with a checkpoint and given back on resume: the in-process tests (no server; those on the real server: tests/integration/plugin/test_whitening_checkpoint.py)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from whitening_moments import assert_moments

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.plugin.whitening_checkpoint import (
    WHITENING_FILE,
    WhiteningCheckpoint,
    whitening_keys,
)
from verl_vllm_rm.scoring.options import run_reward_models


def test_a_checkpoint_without_statistics_starts_afresh_with_a_warning(tmp_path, caplog):
    (tmp_path / "vllm_rm").mkdir()
    (tmp_path / "vllm_rm" / WHITENING_FILE).write_text(json.dumps(
        {"reward_models": {"safety": {"count": 3, "mean": 1.0, "m2": 2.0}}}))
    checkpoint = WhiteningCheckpoint(["helpful"], [])
    with caplog.at_level(logging.WARNING):
        prior = checkpoint.resume(str(tmp_path / "vllm_rm"))
        checkpoint.resume(str(tmp_path / "no_such_folder"))
    assert prior["helpful"].count == 0
    text = caplog.text
    assert "no whitening statistics of reward model 'helpful': they start afresh" in text
    assert "whitening statistics of 'safety', which this run does not whiten: ignored" in text


@pytest.mark.parametrize("content, problem", [
    ("{not json", "Expecting property name"),
    (json.dumps({"models": {}}), "'reward_models'"),
    (json.dumps({"reward_models": {"rm": {"count": -2, "mean": 0.0, "m2": 0.0}}}), "integer count >= 0"),
])
def test_a_damaged_statistics_file_is_an_error_naming_it(tmp_path, content, problem):
    (tmp_path / WHITENING_FILE).write_text(content)
    with pytest.raises(ConfigError, match=rf"cannot resume the reward whitening from .*{WHITENING_FILE}: .*{problem}.*"
                                          "delete it to restart the statistics"):
        WhiteningCheckpoint(["rm"], []).resume(str(tmp_path))


def test_only_vllm_rm_runs_with_whitened_rms_have_statistics(verl_config):
    assert whitening_keys(run_reward_models(verl_config("http://127.0.0.1:1"))) == []  # whiten=none
    two = verl_config("http://127.0.0.1:1", reward_models=[{"name": "a", "whiten": "running"}, {"name": "b"}])
    assert whitening_keys(run_reward_models(two)) == ["a"]
    naive = verl_config("http://127.0.0.1:1", "reward.reward_manager.name=naive", whiten="running")
    assert whitening_keys(run_reward_models(naive)) == []
    attributes = verl_config("http://127.0.0.1:1", reward_models=[
        {"name": "a", "whiten": "running", "attributes": {"verbosity": -0.5, "helpfulness": 1.0}}, {"name": "b"}])
    assert whitening_keys(run_reward_models(attributes)) == ["a/verbosity", "a/helpfulness"]  # one per attribute


ATTRIBUTES = {"helpfulness": 1.0, "verbosity": -0.5}
HELPSTEER = ("helpfulness", "correctness", "coherence", "complexity", "verbosity")


@pytest.fixture()
def local_workers(monkeypatch, load_manager, verl_config, tokenizer):
    """``local_workers(n)``: ``n`` stand-ins for verl's reward-loop workers, each holding a real manager with a
    whitened attribute RM told its head; ``on_every_worker`` calls them in this process instead of through Ray."""
    import types

    from verl_vllm_rm.plugin import whitening_checkpoint
    from verl_vllm_rm.protocol.model_shape import HeadKind, ModelShape

    monkeypatch.setattr(whitening_checkpoint, "on_every_worker",
                        lambda workers, fn, *args: [fn(worker, *args) for worker in workers])
    shape = ModelShape(HeadKind.ATTRIBUTES, "LlamaForSequenceClassification", HELPSTEER, "float32", "float32")

    def make(n: int) -> list:
        workers = []
        for _ in range(n):
            manager = load_manager(verl_config("http://127.0.0.1:1", attributes=ATTRIBUTES, whiten="running"),
                                   tokenizer)
            manager.rm.check_head(shape)
            workers.append(types.SimpleNamespace(reward_manager=manager))
        return workers

    return make


def score(worker, rows: np.ndarray) -> None:
    """Training samples' head answers, through the RM's scale (which whitens and updates each attribute)."""
    from verl_vllm_rm.scoring.reward_model import Scored

    rm = worker.reward_manager.rm
    for row in rows:
        scored = Scored(None, 0, 0.0, attributes=[float(x) for x in row])
        rm.scale(scored, rm.value(scored, None), update=True)


def test_each_attribute_is_saved_merged_across_workers_and_resumed(local_workers, tmp_path):
    rows = np.random.default_rng(0).normal(np.arange(5.0), [3.0, 1.0, 1.0, 1.0, 10.0], size=(30, 5))
    first = local_workers(2)
    score(first[0], rows[:11])
    score(first[1], rows[11:])
    keys = ["rm/helpfulness", "rm/verbosity"]
    saved = WhiteningCheckpoint(keys, first)
    saved.save(str(tmp_path / "vllm_rm"))
    on_disk = json.loads((tmp_path / "vllm_rm" / WHITENING_FILE).read_text())["reward_models"]
    assert sorted(on_disk) == keys
    for key in keys:
        column = rows[:, HELPSTEER.index(key.split("/")[1])]
        assert on_disk[key]["count"] == len(rows)
        assert on_disk[key]["mean"] == pytest.approx(column.mean())
        assert on_disk[key]["m2"] == pytest.approx(((column - column.mean()) ** 2).sum())

    resumed = local_workers(2)
    checkpoint = WhiteningCheckpoint(keys, resumed)
    prior = checkpoint.resume(str(tmp_path / "vllm_rm"))
    later = rows[:4] + 1.0
    score(resumed[1], later)
    for key in keys:
        j = HELPSTEER.index(key.split("/")[1])
        assert_moments(prior[key], rows[:, j])
        assert_moments(checkpoint.merged()[key], np.concatenate([rows[:, j], later[:, j]]))  # the prior once
        fresh = resumed[0].reward_manager.rm.whitenings[key]  # scored nothing since: the prior alone
        assert fresh.seen.count == 0
        assert fresh.whiten(1.0) == pytest.approx((1.0 - rows[:, j].mean()) / rows[:, j].std())


def test_a_checkpoint_without_an_attributes_statistics_starts_it_afresh(local_workers, tmp_path, caplog):
    (tmp_path / WHITENING_FILE).write_text(json.dumps({"reward_models": {
        "rm/helpfulness": {"count": 4, "mean": 2.0, "m2": 8.0}, "rm": {"count": 3, "mean": 1.0, "m2": 2.0}}}))
    workers = local_workers(1)
    with caplog.at_level(logging.WARNING):
        prior = WhiteningCheckpoint(["rm/helpfulness", "rm/verbosity"], workers).resume(str(tmp_path))
    assert prior["rm/helpfulness"].count == 4 and prior["rm/verbosity"].count == 0
    whitenings = workers[0].reward_manager.rm.whitenings
    assert whitenings["rm/helpfulness"].count == 4 and whitenings["rm/verbosity"].count == 0
    assert "no whitening statistics of reward model 'rm', attribute 'verbosity': they start afresh" in caplog.text
    assert "whitening statistics of 'rm', which this run does not whiten: ignored" in caplog.text
