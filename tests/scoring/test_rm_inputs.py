"""Reading trajectories out of a verl ``DataProto``: the batch path and the one-row path agree, row by row."""

from __future__ import annotations

from verl_vllm_rm.dev.grpo_batch import Group, build_batch
from verl_vllm_rm.scoring.rm_inputs import sample_of_row, samples_from_batch

PAD = 0


def _groups() -> list[Group]:
    # uneven prompt and response lengths (left/right padding differ per row), an empty response, pad-valued ids
    return [
        Group([5, 6, 7], [[8, 9], [], [10, 0, 11]], ground_truth="a", raw_prompt=[{"role": "user", "content": "x"}]),
        Group([12], [[13, 14, 15, 16], [17]], ground_truth="b", data_source="other",
              raw_prompt=[{"role": "user", "content": "y"}]),
    ]


def test_batch_rows_are_each_rows_valid_ids_and_fields():
    groups = _groups()
    data = build_batch(groups, PAD)
    samples = samples_from_batch(data)
    expected = [(g, r) for g in groups for r in g.response_ids]
    assert len(samples) == len(expected) == len(data)
    for sample, (group, response) in zip(samples, expected):
        assert sample.prompt_ids == group.prompt_ids  # left padding dropped
        assert sample.response_ids == response  # right padding dropped; a pad-valued id inside is kept
        assert all(type(x) is int for x in sample.prompt_ids + sample.response_ids)  # JSON-ready, no numpy ints
        assert sample.fields["data_source"] == group.data_source
        assert sample.fields["reward_model"]["ground_truth"] == group.ground_truth
        assert sample.validate is False
    uids = [s.fields["uid"] for s in samples]
    assert uids[:3] == [uids[0]] * 3 and uids[3:] == [uids[3]] * 2 and uids[0] != uids[3]


def test_one_row_slice_reads_exactly_like_its_batch_row():
    """verl's reward loop hands ``run_single`` ``data[i:i+1]``; the one-row reader must not differ."""
    data = build_batch(_groups(), PAD)
    data.meta_info["validate"] = True
    batch = samples_from_batch(data)
    for i in range(len(data)):
        assert sample_of_row(data[i : i + 1]) == batch[i]
        assert sample_of_row(data, i) == batch[i]
    assert sample_of_row(data) == batch[-1]  # the default: the last row, as run_single reads it
    assert all(s.validate for s in batch)
