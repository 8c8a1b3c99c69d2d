"""Reading trajectories out of verl's rows (``rows.py``): the batch path and the one-row path agree, row by row,
and the padded layout and TransferQueue's jagged one give the same ids."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import torch

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.rows import VALIDATION_FIELD, Sample, last_output, samples_of, samples_of_rows, unpadded

PAD = 0


def _groups() -> list[Group]:
    # uneven prompt and response lengths (left/right padding differ per row), an empty response, pad-valued ids
    return [
        Group([5, 6, 7], [[8, 9], [], [10, 0, 11]], ground_truth="a", raw_prompt=[{"role": "user", "content": "x"}]),
        Group([12], [[13, 14, 15, 16], [17]], ground_truth="b", data_source="other",
              raw_prompt=[{"role": "user", "content": "y"}]),
    ]


def _plain(samples: list[Sample]) -> list[tuple]:
    return [(s.prompt_ids.tolist(), s.response_ids.tolist(), s.fields, s.validate) for s in samples]


def test_batch_rows_are_each_rows_valid_ids_and_fields():
    groups = _groups()
    data = build_batch(groups, PAD)
    samples = samples_of([data])
    expected = [(g, r) for g in groups for r in g.response_ids]
    assert len(samples) == len(expected) == len(data)
    for sample, (group, response) in zip(samples, expected):
        assert sample.prompt_ids.tolist() == group.prompt_ids  # left padding dropped
        assert sample.response_ids.tolist() == response  # right padding dropped; a pad-valued id inside is kept
        for ids in (sample.prompt_ids, sample.response_ids):  # JSON-ready as the HTTP layer encodes them
            assert ids.dtype == np.int64
            assert orjson.loads(orjson.dumps(ids, option=orjson.OPT_SERIALIZE_NUMPY)) == ids.tolist()
        assert sample.fields["data_source"] == group.data_source
        assert sample.fields["reward_model"]["ground_truth"] == group.ground_truth
        assert sample.validate is False
    uids = [s.fields["uid"] for s in samples]
    assert uids[:3] == [uids[0]] * 3 and uids[3:] == [uids[3]] * 2 and uids[0] != uids[3]


def test_one_row_slices_read_together_exactly_like_their_batch_rows():
    """verl's reward loop hands ``run_single`` ``data[i:i+1]``; the rows read together must not differ."""
    data = build_batch(_groups(), PAD)
    data.meta_info["validate"] = True
    batch = samples_of([data])
    rows = [data[i : i + 1] for i in range(len(data))]
    assert _plain(samples_of(rows)) == _plain(samples_of_rows(rows)) == _plain(batch)
    assert _plain([samples_of([row])[0] for row in rows]) == _plain(batch)
    assert all(s.validate for s in batch)


def test_a_row_tagged_for_validation_validates_alone():
    """The trainer modes tag each validation prompt (verl's per-trajectory reward call has no validate flag): a
    tagged row validates, its untagged neighbours (a training rollout in flight beside it) do not."""
    data = build_batch(_groups(), PAD)
    data.non_tensor_batch[VALIDATION_FIELD] = np.array([False, False, True, False, True], dtype=object)
    rows = [data[i : i + 1] for i in range(len(data))]
    assert [s.validate for s in samples_of_rows(rows)] == [False, False, True, False, True]


def test_a_prompt_mask_with_holes_keeps_exactly_its_valid_ids():
    """Left padding is read by slicing; a row whose mask is not one block still gets exactly its masked ids."""
    data = build_batch(_groups(), PAD)
    n = data.batch["prompts"].shape[1]
    data.batch["attention_mask"][0, n - 2] = 0  # the prompt [5, 6, 7] loses its middle token
    assert samples_of([data])[0].prompt_ids.tolist() == [5, 7]
    others = [(s.prompt_ids.tolist(), s.response_ids.tolist()) for s in samples_of([data])[1:]]
    assert others == [(g.prompt_ids, r) for g in _groups() for r in g.response_ids][1:]


def test_rows_that_cannot_be_read_together_are_read_alone_each_with_its_own_error():
    wide = build_batch([Group([1, 2, 3, 4, 5, 6], [[7]])], PAD)  # another prompt width: cannot be joined
    data = build_batch(_groups(), PAD)
    broken = data[1:2]
    broken.batch = broken.batch.exclude("attention_mask")  # a malformed row
    with pytest.raises(ValueError, match=r"rows of different widths cannot be read together: \[\(1, \d+\), "):
        samples_of([data[0:1], wide])
    read = samples_of_rows([data[0:1], wide, broken])
    assert _plain(read[:1]) == _plain(samples_of([data])[:1])
    assert read[1].prompt_ids.tolist() == [1, 2, 3, 4, 5, 6] and read[1].response_ids.tolist() == [7]
    assert isinstance(read[2], KeyError) and "attention_mask" in str(read[2])


def test_a_row_that_is_not_one_row_long_gets_its_own_error_and_the_others_read_right():
    """run_single's reader takes each row's fields at index 0: a two-row DataProto among one-row ones must fail
    alone (its tensors and fields disagree), never shift the other rows' fields."""
    data = build_batch(_groups(), PAD)
    read = samples_of_rows([data[0:1], data[1:3], data[3:4]])
    assert _plain([read[0], read[2]]) == _plain([samples_of([data])[i] for i in (0, 3)])
    assert isinstance(read[1], ValueError)
    assert str(read[1]) == ("run_single was handed 2 rows in one DataProto: verl's reward loop hands it one row per "
                            "call (last_output takes a trajectory's last)")


def test_jagged_rows_read_like_their_padded_batch():
    """TransferQueue hands the online RM trainer jagged rows (no padding, no mask): the same reader gives the same ids."""
    data = build_batch(_groups(), PAD)
    padded = unpadded(data.batch["prompts"], data.batch["responses"], data.batch["attention_mask"])
    prompts, responses = padded
    jagged = unpadded(torch.nested.nested_tensor([torch.from_numpy(p) for p in prompts], layout=torch.jagged),
                      torch.nested.nested_tensor([torch.from_numpy(r) for r in responses], layout=torch.jagged))
    assert [[a.tolist() for a in side] for side in jagged] == [[a.tolist() for a in side] for side in padded]
    with pytest.raises(ValueError, match="padded prompts and responses need their attention_mask"):
        unpadded(data.batch["prompts"], data.batch["responses"])


def _trajectory(outputs: list[tuple[list[int], list[int]]]):
    """One trajectory's outputs laid out as verl 0.9.1's ``AgentLoopWorker._compute_score`` hands them to
    ``run_single`` (agent_loop.py, around line 985): one row per output, prompts, responses and a mask of ones over
    prompt + response each RIGHT-padded to the longest, every row's ``prompt_len``/``response_len`` beside them.
    (The whole call, through verl's own code and a real Ray reward worker: tests/integration/scoring/test_reward_loop_ray.py.)"""
    from torch.nn.utils.rnn import pad_sequence

    from verl import DataProto

    def padded(rows):
        return pad_sequence([torch.tensor(r, dtype=torch.int64) for r in rows], batch_first=True, padding_value=0)

    n = len(outputs)
    return DataProto.from_dict(
        tensors={"prompts": padded([p for p, _ in outputs]), "responses": padded([r for _, r in outputs]),
                 "attention_mask": padded([[1] * (len(p) + len(r)) for p, r in outputs])},
        non_tensors={"data_source": np.array(["d"] * n, dtype=object),
                     "prompt_len": np.array([len(p) for p, _ in outputs]),
                     "response_len": np.array([len(r) for _, r in outputs])})


def test_a_trajectory_of_several_outputs_is_read_at_its_last_and_each_output_exactly():
    """``run_single`` scores a trajectory's last output (``last_output``, as verl's own managers do); each output's
    ids are read with verl's lengths beside them (the right-padded mask does not split prompt from response)."""
    outputs = [([5, 6], [7, 8, 9, 10]), ([11, 12, 13, 14, 15], [16]), ([17, 18, 19], [20, 21, 22, 23, 24, 25])]
    data = _trajectory(outputs)
    (last,) = samples_of([last_output(data)])
    assert (last.prompt_ids.tolist(), last.response_ids.tolist()) == outputs[-1]
    assert [(s.prompt_ids.tolist(), s.response_ids.tolist()) for s in samples_of([data])] == outputs
    single = data[2:3]
    assert last_output(single) is single


def test_zero_width_prompts_are_read_as_empty_prompts():
    """A trajectory without prompt tokens (verl's agent loop builds a zero-width ``prompts`` tensor) and a padded
    batch whose prompts are all empty: empty prompts, the responses exact (numpy's argmax has no empty search)."""
    (sample,) = samples_of([_trajectory([([], [3, 4, 5])])])
    assert (sample.prompt_ids.tolist(), sample.response_ids.tolist()) == ([], [3, 4, 5])
    batch = build_batch([Group([], [[1, 2], [3]])], PAD)
    assert batch.batch["prompts"].shape[1] == 0
    assert [(s.prompt_ids.tolist(), s.response_ids.tolist()) for s in samples_of([batch])] == [([], [1, 2]), ([], [3])]
