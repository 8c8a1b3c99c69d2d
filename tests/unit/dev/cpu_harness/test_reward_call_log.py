"""The harness's probe of verl's reward calls (``dev/cpu_harness/reward_call_log.py``): with the log variable set,
each ``RewardLoopWorker.compute_score`` call appends its trajectory (uid, data source, prompt and response ids,
validate) with its answer's extra info or its error, and still returns verl's score or raises its error; without it
nothing is written. On verl's own worker with its naive reward manager, in
this process."""

from __future__ import annotations

import json

import pytest

from verl_vllm_rm.dev.cpu_harness.reward_call_log import log_reward_calls, reward_call_record, reward_calls_loggable
from verl_vllm_rm.dev.cpu_names import REWARD_CALL_LOG_ENV
from verl_vllm_rm.dev.grpo_batch import Group, build_batch


@pytest.fixture(scope="module")
def worker(tiny_rm):
    """verl's reward-loop worker of a run on the tiny RM's tokenizer (naive manager: gsm8k's rule)."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_vllm_rm.dev.loader import compose_verl_config

    return RewardLoopWorker(compose_verl_config([f"actor_rollout_ref.model.path={tiny_rm}"]))


@pytest.fixture()
def probed(monkeypatch):
    """The probe applied to RewardLoopWorker, taken off after the test."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    monkeypatch.setattr(RewardLoopWorker, "compute_score", RewardLoopWorker.compute_score)
    log_reward_calls()


def batch(tokenizer, answer: str = " The answer is 7. #### 7"):
    prompt = tokenizer("What is 3 + 4?").input_ids
    return build_batch([Group(prompt, [tokenizer(answer).input_ids, tokenizer(" no idea").input_ids],
                              ground_truth="7", data_source="openai/gsm8k")], pad_id=tokenizer.pad_token_id)


def test_the_record_is_the_rows_uid_and_unpadded_ids():
    data = build_batch([Group([5, 6, 7], [[8, 9], [10]])], pad_id=0, prompt_len=5, response_len=4)
    record = reward_call_record(data[1:2])
    assert record == {"uid": str(data.non_tensor_batch["uid"][1]), "data_source": "vllm_rm/demo",
                      "prompt_ids": [5, 6, 7], "response_ids": [10], "validate": False}
    data.meta_info["validate"] = True
    data.non_tensor_batch.pop("uid")
    data.non_tensor_batch.pop("data_source")
    assert reward_call_record(data[0:1]) == {"uid": None, "data_source": None, "prompt_ids": [5, 6, 7],
                                             "response_ids": [8, 9], "validate": True}


def test_each_reward_call_appends_its_trajectory_and_returns_verls_score(worker, probed, tokenizer, tmp_path,
                                                                          monkeypatch):
    log = tmp_path / "reward_calls.jsonl"
    monkeypatch.setenv(REWARD_CALL_LOG_ENV, str(log))
    log_reward_calls()  # a second application wraps nothing more: one line per call
    data = batch(tokenizer)
    scores = [worker.loop.run_until_complete(worker.compute_score(data[i:i + 1])) for i in range(2)]
    assert [s["reward_score"] for s in scores] == [1.0, 0.0]  # gsm8k: "#### 7" is right, "no idea" is not
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [{"uid": str(data.non_tensor_batch["uid"][i]), "data_source": "openai/gsm8k",
                      "prompt_ids": tokenizer("What is 3 + 4?").input_ids,
                      "response_ids": tokenizer(answer).input_ids, "validate": False,
                      "reward_extra_info": json.loads(json.dumps(scores[i]["reward_extra_info"]))}
                     for i, answer in enumerate([" The answer is 7. #### 7", " no idea"])]


def test_a_call_that_fails_is_logged_with_its_error_and_raised(worker, probed, tokenizer, tmp_path, monkeypatch):
    log = tmp_path / "reward_calls.jsonl"
    monkeypatch.setenv(REWARD_CALL_LOG_ENV, str(log))
    prompt = tokenizer("What is 3 + 4?").input_ids
    data = build_batch([Group(prompt, [tokenizer(" 7").input_ids], ground_truth="7", data_source="no/such_source")],
                       pad_id=tokenizer.pad_token_id)
    with pytest.raises(NotImplementedError) as raised:  # verl's default_compute_score knows no such data source
        worker.loop.run_until_complete(worker.compute_score(data[0:1]))
    (line,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert line["data_source"] == "no/such_source" and "reward_extra_info" not in line
    assert line["error"] == f"NotImplementedError: {raised.value}"


def test_without_the_variable_nothing_is_written(worker, probed, tokenizer, tmp_path, monkeypatch):
    monkeypatch.delenv(REWARD_CALL_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    score = worker.loop.run_until_complete(worker.compute_score(batch(tokenizer)[0:1]))
    assert score["reward_score"] == 1.0 and list(tmp_path.iterdir()) == []


def test_the_installed_verl_still_scores_one_trajectory_a_call():
    assert reward_calls_loggable()
