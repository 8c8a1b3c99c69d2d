"""Length rewards in tokens (``rewards/length.py``): band limits (checked against rm-gallery's ``length_penalty``,
which counts characters: characters become our tokens), DAPO's overlong penalty (checked against verl), thought
length."""

from __future__ import annotations

import numpy as np
import pytest

from verl_vllm_rm.rewards import (
    ThinkTagIds,
    band_penalty,
    length_reward,
    overlong_penalty,
    thought_length_reward,
)

TAGS = ThinkTagIds(open=(1,), close=(2,))


def test_band_is_zero_inside_and_at_both_limits():
    lengths = [0, 9, 10, 15, 20, 21, 30]
    got = band_penalty(lengths, min_tokens=10, max_tokens=20, penalty_per_token=0.5)
    np.testing.assert_array_equal(got, [-5.0, -0.5, 0.0, 0.0, 0.0, -0.5, -5.0])
    assert not np.signbit(got[2:5]).any()  # a clean 0.0, not -0.0, in logs


def test_band_without_upper_bound():
    np.testing.assert_array_equal(band_penalty([3, 10**6], min_tokens=5, penalty_per_token=1.0), [-2.0, 0.0])


@pytest.mark.parametrize(
    "length, expected",
    [(0, 0.0), (79, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (99, -0.95), (100, -1.0)],
)
def test_overlong_ramps_over_the_last_buffer_tokens(length, expected):
    got = overlong_penalty([length], max_response_tokens=100, overlong_buffer=20)
    assert got[0] == pytest.approx(expected)
    assert overlong_penalty([length], 100, 20, overlong_penalty_factor=2.0)[0] == pytest.approx(2 * expected)


def test_overlong_matches_verls_dapo_reward_manager(word_tokenizer):
    """Same numbers as verl's DAPO manager (reward_loop/reward_manager/dapo.py) with compute_score = 0."""
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    max_len, buffer, factor = 64, 16, 1.5
    config = OmegaConf.create({"reward": {"reward_kwargs": {
        "max_resp_len": max_len,
        "overlong_buffer_cfg": {"enable": True, "len": buffer, "penalty_factor": factor, "log": False},
    }}})
    manager = DAPORewardManager(config, word_tokenizer, compute_score=lambda **_: 0.0)
    lengths = [0, 1, 40, 47, 48, 49, 56, 63, 64]
    prompt_len = 4
    for length in lengths:
        mask = torch.zeros(1, prompt_len + max_len, dtype=torch.long)
        mask[0, : prompt_len + length] = 1
        row = DataProto.from_dict(
            tensors={"prompts": torch.full((1, prompt_len), 2), "responses": torch.full((1, max_len), 2),
                     "attention_mask": mask},
            non_tensors={"data_source": np.array(["x"], dtype=object),
                         "reward_model": np.array([{"ground_truth": ""}], dtype=object)},
        )
        dapo = manager.loop.run_until_complete(manager.run_single(row))["reward_score"]
        ours = overlong_penalty([length], max_len, buffer, overlong_penalty_factor=factor)[0]
        assert float(dapo) == pytest.approx(ours), length


def test_length_reward_adds_band_and_overlong_and_returns_raw_lengths():
    lengths = np.array([5, 50, 95, 100])
    values, raw = length_reward(lengths, min_tokens=10, max_tokens=90, penalty_per_token=0.1,
                                max_response_tokens=100, overlong_buffer=10)
    np.testing.assert_allclose(values, [-0.5, 0.0, -0.5 - 0.5, -1.0 - 1.0])
    np.testing.assert_array_equal(raw, [5.0, 50.0, 95.0, 100.0])
    off, _ = length_reward(lengths, min_tokens=10, max_tokens=90, penalty_per_token=0.1)
    np.testing.assert_allclose(off, [-0.5, 0.0, -0.5, -1.0])


def test_thought_length_reward_band_and_raw(padded):
    ids, lengths = padded([[1, 5, 5, 5, 2], [1, 5, 5, 5, 5, 5, 2], [9, 9]])
    values, thought = thought_length_reward(ids, lengths, TAGS, min_tokens=2, max_tokens=3, penalty_per_token=1.0)
    np.testing.assert_array_equal(thought, [3, 5, 0])
    np.testing.assert_array_equal(values, [0.0, -2.0, -2.0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: band_penalty([1], min_tokens=-1), "min_tokens must be an integer >= 0"),
        (lambda: band_penalty([1], min_tokens=10, max_tokens=5), "max_tokens must be null"),
        (lambda: band_penalty([1], min_tokens=True), "min_tokens must be an integer"),
        (lambda: band_penalty([1], penalty_per_token=-0.1), "penalty_per_token must be a finite number >= 0"),
        (lambda: length_reward([1], overlong_buffer=8), "needs max_response_tokens"),
        (lambda: length_reward([1], max_response_tokens=4, overlong_buffer=8), "needs max_response_tokens"),
        (lambda: length_reward([1], overlong_buffer=-1), "overlong_buffer must be an integer >= 0"),
        (lambda: overlong_penalty([1], 10, 0), "needs overlong_buffer > 0"),
        (lambda: overlong_penalty([1], 10, 5, float("inf")), "overlong_penalty_factor must be a finite number"),
    ],
)
def test_bad_parameters_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_length_penalty_identical_when_counting_characters(corpus, gallery_results):
    theirs = [score for score, _ in gallery_results("length_penalty", corpus)]  # min 10, max 1000, rate 0.01
    ours = band_penalty([len(t) for t in corpus], min_tokens=10, max_tokens=1000, penalty_per_token=0.01)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    kinds = {("short" if len(t) < 10 else "long" if len(t) > 1000 else "in band", v < 0)
             for t, v in zip(corpus, theirs)}
    assert kinds == {("short", True), ("long", True), ("in band", False)}
