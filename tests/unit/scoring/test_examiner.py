"""The ``num_examine`` print (``scoring/examiner.py``): the first samples of each ``data_source``, each with its
decoded prompt and response and every ``reward_extra_info`` column, floats rounded; later samples stay silent."""

from __future__ import annotations

import numpy as np

from verl_vllm_rm.rows import Sample
from verl_vllm_rm.scoring.examiner import Examiner


def sample(tokenizer, prompt: str, response: str, **fields) -> Sample:
    return Sample(np.array(tokenizer.encode(prompt, add_special_tokens=False)),
                  np.array(tokenizer.encode(response + "<|endoftext|>", add_special_tokens=False)), fields)


def test_the_first_samples_of_each_data_source_are_printed_with_every_column(tokenizer, capsys):
    examiner = Examiner(tokenizer, num_examine=1)
    examiner.maybe_print(sample(tokenizer, "What is two plus two?", "It is four.", data_source="math"),
                         {"score": 0.1234567891, "rm_valid": 1.0, "pred": "4", "win": None})
    assert capsys.readouterr().out.splitlines() == [
        "[vllm_rm] data_source=math",
        "[prompt] What is two plus two?",
        "[response] It is four.",  # special tokens left out
        "[score] 0.123457",
        "[rm_valid] 1.0",
        "[pred] 4",
        "[win] None",
    ]
    examiner.maybe_print(sample(tokenizer, "And three?", "Six.", data_source="math"), {"score": 1.0})
    assert capsys.readouterr().out == ""  # math has had its one
    examiner.maybe_print(sample(tokenizer, "Say hi.", "Hi."), {"score": 1.0})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[vllm_rm] data_source=unknown" and out[2] == "[response] Hi."


def test_num_examine_counts_per_data_source_and_zero_prints_nothing(tokenizer, capsys):
    examiner = Examiner(tokenizer, num_examine=2)
    for source in ("a", "b", "a", "a", "b", "b"):
        examiner.maybe_print(sample(tokenizer, "q", "r", data_source=source), {})
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[vllm_rm]")]
    assert printed == ["[vllm_rm] data_source=a", "[vllm_rm] data_source=b", "[vllm_rm] data_source=a",
                       "[vllm_rm] data_source=b"]
    silent = Examiner(tokenizer, num_examine=0)
    silent.maybe_print(sample(tokenizer, "q", "r", data_source="a"), {"score": 1.0})
    assert capsys.readouterr().out == ""
