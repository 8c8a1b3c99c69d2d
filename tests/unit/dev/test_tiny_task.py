"""The tiny task (``dev/tiny_task.py``): small sums, the preferred answer and the three rejected styles, preference
pairs, and the train/val parquet files in verl's RLHF format."""

from __future__ import annotations

import random

import pandas as pd

from verl_vllm_rm.dev.tiny_task import (DATA_SOURCE, MATH_DAPO, MAX_OPERAND, Pair, bad_answers, encode_pairs,
                                        good_answer, preference_pairs, question, write_dataset)


def test_the_preferred_answer_thinks_then_states_the_sum_in_gsm8ks_form():
    assert question(3, 4) == "What is 3 + 4? Please compute the sum."
    assert good_answer(3, 4) == " <think>add 3 and 4</think> The answer is 7. #### 7"


def test_the_rejected_answers_get_the_sum_wrong_skip_the_think_block_or_ramble():
    for seed in range(20):
        wrong, plain, ramble = bad_answers(12, 5, random.Random(seed))
        value = int(wrong.split("#### ")[1])
        assert value != 17 and value - 17 in (-3, -2, -1, 1, 2, 3, 10)
        assert wrong == f" <think>add 12 and 5</think> The answer is {value}. #### {value}"
        assert plain == " The answer is 17."
        words = ramble.split()
        assert set(words) == {"so"} and 9 <= len(words) <= 15 and ramble.startswith(" so ")


def test_preference_pairs_prefer_the_good_answer_and_repeat_with_the_seed():
    pairs = preference_pairs(30, seed=4)
    assert pairs == preference_pairs(30, seed=4) and pairs != preference_pairs(30, seed=5)
    for pair in pairs:
        a, b = (int(n) for n in pair.prompt.split("What is ")[1].split("?")[0].split(" + "))
        assert 0 <= a <= MAX_OPERAND and 0 <= b <= MAX_OPERAND
        assert pair.chosen == good_answer(a, b) and pair.rejected != pair.chosen
        assert not pair.rejected.startswith(" <think>") or f"The answer is {a + b}." not in pair.rejected
    assert max(int(p.prompt.split()[2]) for p in preference_pairs(50, seed=1, max_operand=3)) <= 3


def test_the_dataset_is_verls_rlhf_format_with_the_reference_answer(tmp_path):
    train, val = write_dataset(tmp_path / "data", n_train=6, n_val=3, seed=2)
    assert (train.name, val.name) == ("train.parquet", "val.parquet")
    rows = pd.read_parquet(train).to_dict("records")
    assert len(rows) == 6 and len(pd.read_parquet(val)) == 3
    for index, row in enumerate(rows):
        (message,) = row["prompt"]
        assert message["role"] == "user"
        a, b = (int(n) for n in message["content"].split("What is ")[1].split("?")[0].split(" + "))
        assert (row["data_source"], row["ability"]) == (DATA_SOURCE, "math")
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(a + b)}
        assert row["extra_info"] == {"split": "train", "index": index, "reference": good_answer(a, b)}


def test_every_nth_row_can_be_a_math_dapo_one(tmp_path):
    train, _ = write_dataset(tmp_path, n_train=7, n_val=1, math_dapo_every=3)
    assert list(pd.read_parquet(train)["data_source"]) == [MATH_DAPO, DATA_SOURCE, DATA_SOURCE, MATH_DAPO,
                                                           DATA_SOURCE, DATA_SOURCE, MATH_DAPO]


def test_encoded_pairs_are_the_prompt_and_each_answer_padded(tokenizer):
    pairs = [Pair("What is 1 + 1?", " 2", " three hundred"), Pair("Q?", " <think>x</think> long answer", " no")]
    batch = encode_pairs(tokenizer, pairs)
    for row, pair in enumerate(pairs):
        chosen = tokenizer(pair.prompt + pair.chosen).input_ids
        rejected = tokenizer(pair.prompt + pair.rejected).input_ids
        assert batch.chosen_ids[row][batch.chosen_mask[row].bool()].tolist() == chosen
        assert batch.rejected_ids[row][batch.rejected_mask[row].bool()].tolist() == rejected
