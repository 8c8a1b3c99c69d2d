"""A two-class RM ([bad, good]) trained online on verl's engine, ``full`` and ``lora``: the engine trains the
margin good - bad (the reward the server reads from the head), publishes the head's two rows as the server holds
them, and after every step the server answers the trainer's margin raw and its sigmoid, P(good), normalized.
The trained RM exports as the two-class classifier it started as. Real Ray workers, real vLLM server.
"""

from __future__ import annotations

import pytest
import torch
from sync_helpers import PARITY_ATOL, engine_rm_config, load_rm, max_diff, runtime_version

from verl_vllm_rm.dev.tiny_rm_families import build_tiny_two_class_rm
from verl_vllm_rm.replicas.launcher import running_server

pytestmark = pytest.mark.server

MODES = ("full", "lora")


@pytest.fixture(scope="module")
def two_class_rm(tmp_path_factory) -> str:
    return str(build_tiny_two_class_rm(tmp_path_factory.mktemp("two_class_rm")))


@pytest.fixture(scope="module")
def two_class_server(two_class_rm, server_args):
    with running_server(two_class_rm, [*server_args, "--enable-weight-updates"]) as server:
        yield server


def served(url: str, ids: list[list[int]], normalize: bool) -> list[float]:
    import requests

    answer = requests.post(f"{url}/score", json={"input": ids, "normalize": normalize}, timeout=60)
    assert answer.status_code == 200, answer.text
    return [item["score"] for item in answer.json()["data"]]


@pytest.fixture(scope="module")
def runs(ray_cluster, two_class_server, two_class_rm, rollout, probe_ids, tmp_path_factory):
    """mode -> the served margins before training, and per step: metrics, version, served raw and normalized
    scores, the trainer's reference; the run's checkpoint folder."""
    from verl_vllm_rm.online.driver import OnlineRewardModel
    from verl_vllm_rm.weight_sync import RewardModelPublisher

    uids, sequences, rewards, _ = rollout
    out, checkpoints = {}, tmp_path_factory.mktemp("two_class_engine")
    url = two_class_server.url
    for mode in MODES:
        with RewardModelPublisher(url, timeout_s=60) as publisher:  # the model on disk again
            publisher.publish(load_rm(two_class_rm), publisher.version + 1, "full")
        record = {"initial": served(url, probe_ids, False), "steps": []}
        rm = OnlineRewardModel(engine_rm_config(two_class_rm, url, mode, 1))
        for step in (1, 2):
            metrics = rm.train_on_rollout(uids, sequences, rewards, step=step)
            record["steps"].append({"metrics": metrics, "version": runtime_version(url),
                                    "raw": served(url, probe_ids, False), "normalized": served(url, probe_ids, True),
                                    "reference": rm.worker_group.reference_scores(probe_ids)[0]})
        rm.save_checkpoint(str(checkpoints / mode / "online_rm"))
        rm.close()
        out[mode] = record
    return out, checkpoints


def test_the_untrained_two_class_rm_serves_its_margin(runs, two_class_rm, probe_ids):
    from verl_vllm_rm.parity.reference import load_reward_model

    model = load_reward_model(two_class_rm)
    with torch.no_grad():
        logits = [model(torch.tensor([ids])).logits[0] for ids in probe_ids]
    margins = [float(row[1] - row[0]) for row in logits]  # [bad, good]
    for mode in MODES:
        assert max_diff(runs[0][mode]["initial"], margins) <= PARITY_ATOL


@pytest.mark.parametrize("mode", MODES)
def test_each_step_trains_the_margin_and_the_server_answers_it_and_p_good(runs, mode):
    steps = runs[0][mode]["steps"]
    assert steps[1]["version"] == steps[0]["version"] + 1
    assert steps[1]["metrics"]["rm/bt_loss"] < steps[0]["metrics"]["rm/bt_loss"]  # it learns
    for record in steps:
        assert record["metrics"]["rm/parity_max_abs_diff"] <= PARITY_ATOL
        assert max_diff(record["raw"], record["reference"]) <= PARITY_ATOL
        p_good = torch.sigmoid(torch.tensor(record["reference"])).tolist()
        assert max_diff(record["normalized"], p_good) <= PARITY_ATOL
    assert max_diff(steps[0]["raw"], runs[0][mode]["initial"]) > 1e-4  # the first step moved it
    assert max_diff(steps[1]["raw"], steps[0]["raw"]) > 1e-4


@pytest.mark.parametrize("mode", MODES)
def test_the_trained_two_class_rm_exports_as_a_two_class_classifier(runs, mode, probe_ids, tmp_path):
    import json

    from verl_vllm_rm.online.export import export_trained_rm
    from verl_vllm_rm.parity.reference import load_reward_model, sequence_scores

    out = export_trained_rm(runs[1] / mode / "online_rm", tmp_path / "exported")
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "bad", "1": "good"}
    assert max_diff(sequence_scores(load_reward_model(str(out)), probe_ids),
                    runs[0][mode]["steps"][1]["reference"]) <= 1e-5
