"""Trainer mode ``vllm_rm`` (``plugin/trainer_modes.py``) in-process: a step's rewards out of the rows verl's agent
loop wrote, the rollout dump's columns, and where checkpoints are (the trainer mode with verl's own pieces and a real
TransferQueue: tests/integration/plugin/test_metrics_trainer_mode.py)."""

from __future__ import annotations

import pytest
import torch
from transfer_queue import KVBatchMeta

from verl_vllm_rm.options import ConfigError
from verl_vllm_rm.plugin.trainer_modes import (
    RewardMetrics, dump_columns, real_keys, resumed_folder, reward_extra_info, step_folder, step_rewards,
)


def step_data(infos: list[dict], lengths: list[int], uids: list[str]) -> dict:
    """A step's fields as TransferQueue gives them: each response a row of a jagged tensor."""
    responses = torch.nested.as_nested_tensor([torch.arange(n) for n in lengths], layout=torch.jagged)
    return {"uid": uids, "responses": responses, "extra_fields": [{"reward_extra_info": info} for info in infos]}


def test_the_resumed_folder_is_the_one_verl_resumed(compose_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # verl resolves a relative default_local_dir against the working directory
    auto = compose_config(["trainer.default_local_dir=ckpts/run", "trainer.resume_mode=auto"])
    assert resumed_folder(auto, 3) == str(tmp_path / "ckpts" / "run" / "global_step_3")
    path = compose_config(["trainer.resume_mode=resume_path", "trainer.resume_from_path=old/global_step_9"])
    assert resumed_folder(path, 9) == str(tmp_path / "old" / "global_step_9")


def test_a_steps_folder_is_verls_global_step_folder(compose_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert step_folder(compose_config(["trainer.default_local_dir=ckpts/run"]), 12) == \
        str(tmp_path / "ckpts" / "run" / "global_step_12")
    absolute = compose_config([f"trainer.default_local_dir={tmp_path}/abs"])
    assert step_folder(absolute, 1) == f"{tmp_path}/abs/global_step_1"


def test_reward_extra_info_unwraps_one_element_lists_and_a_row_without_it_is_empty():
    row = {"reward_extra_info": {"rm_score": [0.5], "token_rewards": [0.0, 1.0], "win": None}}
    assert reward_extra_info(row) == {"rm_score": 0.5, "token_rewards": [0.0, 1.0], "win": None}
    assert reward_extra_info({"other": 1}) == {} and reward_extra_info("not a row") == {}


def test_the_rows_verl_adds_for_data_parallel_balance_are_not_the_steps():
    batch = KVBatchMeta(keys=["a", "b", "c", "d"], tags=[{}, {"is_padding": True}, {"is_padding": False}, {}],
                        partition_id="train")
    assert real_keys(batch) == ["a", "c", "d"]


def test_a_steps_rewards_are_its_groups_response_lengths_and_columns():
    infos = [{"rm_valid": [1.0], "score": [0.5]}, {"rm_valid": 1.0, "score": 1.5}, {"rm_valid": [0.0], "score": [-1.0]}]
    rewards = step_rewards(step_data(infos, [2, 4, 1], ["p", "p", "q"]))
    assert rewards.groups.tolist() == ["p", "p", "q"] and rewards.response_length.tolist() == [2, 4, 1]
    assert rewards.columns["score"].tolist() == [0.5, 1.5, -1.0] and rewards.columns["rm_valid"].tolist() == [1, 1, 0]
    columns = dump_columns(["k2", "padding", "k0"], ["k0", "k1", "k2"], rewards)  # verl's dump order, a padding row
    assert columns == {"rm_valid": [0.0, None, 1.0], "score": [-1.0, None, 0.5], "response_length": [1.0, None, 2.0],
                       "group": ["q", None, "p"]}


def test_a_step_of_another_reward_manager_is_refused_naming_both_settings():
    infos = [{"rm_valid": 1.0, "score": 0.5}, {"acc": 1.0}]
    with pytest.raises(ConfigError, match=r"^trainer mode 'vllm_rm' reads the rewards of "
                                          r"reward\.reward_manager\.name=vllm_rm and this run's rollouts have none: "
                                          r"set reward\.reward_manager\.name=vllm_rm, or drop "
                                          r"trainer\.v1\.trainer_mode=vllm_rm$"):
        step_rewards(step_data(infos, [1, 1], ["p", "p"]))


def test_the_trainer_mode_verl_sees_is_the_base_modes_whatever_it_assigns():
    class Colocated(RewardMetrics):
        base_mode = "colocate_async"

    trainer = Colocated()
    trainer.trainer_mode = "vllm_rm_colocate_async"  # what verl assigns from trainer.v1.trainer_mode
    assert trainer.trainer_mode == "colocate_async" and RewardMetrics().trainer_mode == "sync"
