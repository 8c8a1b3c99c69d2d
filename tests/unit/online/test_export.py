"""The trained RM out of verl's checkpoint (``online/export.py``) in-process, on a one-rank checkpoint of plain tensors
written here: the run's state file, the shards joined, the RM rebuilt from ``model_path`` with the checkpoint's
weights and written as a model a server loads (two ranks' FSDP2 shards of a real run, and a checkpoint that does not
fit its RM: tests/integration/online/test_engine_trainer.py)."""

from __future__ import annotations

import json

import pytest
import torch

from verl_vllm_rm.online.export import (
    RM_STATE_FILE, export_trained_rm, load_trained_rm, merged_state_dict, rm_run_state, write_rm_run_state,
)


@pytest.fixture()
def checkpoint(tiny_rm, hf_model, tmp_path):
    """A one-rank checkpoint of the tiny RM whose head was trained (here: doubled), as the RM run leaves it."""
    folder = tmp_path / "online_rm"
    folder.mkdir()
    state = {name: t.detach().clone() for name, t in hf_model.state_dict().items()}
    state["score.weight"] = 2 * state["score.weight"]
    (folder / "fsdp_config.json").write_text(json.dumps({"world_size": 1}))
    torch.save(state, folder / "model_world_size_1_rank_0.pt")
    write_rm_run_state(folder, {"model_path": tiny_rm, "training_mode": "full", "steps": 3})
    return folder, state


def test_the_run_state_is_written_whole_and_read_back(tmp_path):
    write_rm_run_state(tmp_path, {"steps": 1, "model_path": "/rm"})
    write_rm_run_state(tmp_path, {"steps": 2, "model_path": "/rm"})
    assert rm_run_state(tmp_path) == {"steps": 2, "model_path": "/rm"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [RM_STATE_FILE]  # the staged copy replaced it


def test_one_ranks_plain_tensors_are_the_merged_state(checkpoint):
    folder, state = checkpoint
    merged = merged_state_dict(folder)
    assert merged.keys() == state.keys() and all(torch.equal(merged[k], state[k]) for k in state)


def test_the_trained_rm_is_the_started_one_with_the_checkpoints_weights_and_exports_as_a_server_model(
        checkpoint, hf_model, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder, state = checkpoint
    model = load_trained_rm(folder)
    assert type(model).__name__ == "Qwen2ForSequenceClassification" and not model.training
    assert torch.equal(model.score.weight, 2 * hf_model.score.weight)
    assert next(model.parameters()).dtype == torch.float32
    out = export_trained_rm(folder, tmp_path / "exported")
    exported = AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(exported.score.weight, state["score.weight"])
    assert len(AutoTokenizer.from_pretrained(out)) == exported.config.vocab_size


def test_a_checkpoint_missing_a_weight_of_its_rm_is_refused_naming_where_the_rm_is_read_from(checkpoint, tiny_rm):
    folder, state = checkpoint
    del state["score.weight"]
    torch.save(state, folder / "model_world_size_1_rank_0.pt")
    with pytest.raises(ValueError, match=rf"the checkpoint at {folder} does not fit its RM {tiny_rm}: missing "
                                         r"\['score\.weight'\], unexpected \[\]\. The RM is rebuilt from model_path in "
                                         rf"{RM_STATE_FILE} \(the run's online_rm\.model_path\): put the model the run "
                                         r"started from back there, or set model_path to where it is now"):
        load_trained_rm(folder)
