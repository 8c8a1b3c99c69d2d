"""Rule-reward composition inside the manager (through verl's loader, real server)."""

import numpy as np
import pytest

from verl_vllm_rm.dev.grpo_batch import build_batch, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores


REWARDS = "{components:[rubric,verifiable,format,ngram,length],weights:{rubric:0.5,verifiable:2.0,format:0.25}," \
          "format:{pattern:'add add'},ngram:{ngram_size:2},length:{max_tokens:12,penalty_per_token:0.1}}"


# conftest's grpo_groups: per prompt, responses thinking "add " 1, 3, 0 and 6 times, answering a+b, a+b+1, a*b, a+b
FORMAT = [0.0, 1.0, 0.0, 1.0] * 4  # 'add add' appears when "add " is thought at least twice


CORRECT = [1.0, 0.0, 0.0, 1.0] * 4  # gsm8k: '#### a+b'


def bigram_penalty(ids: list[int], max_penalty: float = -1.0, min_scaling: float = 0.1) -> float:
    """docs/rewards.md's n-gram penalty for n=2, written out: r = (T - U) / (T - 1) over the T windows, U
    distinct."""
    windows = [tuple(ids[i:i + 2]) for i in range(len(ids) - 1)]
    total, distinct = len(windows), len(set(windows))
    rate = (total - distinct) / (total - 1) if total >= 2 else 0.0
    return max_penalty * min(max((rate - min_scaling) / (1 - min_scaling), 0.0), 1.0)


def test_total_is_the_weighted_sum_of_components(load_manager, rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    """Every component and the total against values computed here, none read back from the manager: the RM
    score from transformers, format and correctness written out, the n-gram penalty and the length
    penalty from their documented formulas."""
    mgr = load_manager(verl_config(rm_server.url, rewards=REWARDS), tokenizer)
    out = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)
    info = {k: np.asarray(v, dtype=float) for k, v in out["reward_extra_info"].items()}
    rows = [(g, r) for g in grpo_groups for r in g.response_ids]
    lengths = np.array([len(r) for _, r in rows])
    rubric = np.array(sequence_scores(hf_model, [row_token_ids(g, r) for g, r in rows]))
    ngram = np.array([bigram_penalty(r) for _, r in rows])
    assert (ngram < 0).all()  # every response repeats some bigram beyond the tolerated rate
    length = -0.1 * np.maximum(lengths - 12, 0)
    assert np.allclose(info["rm_score"], rubric, atol=1e-4)
    assert info["format"].tolist() == FORMAT
    assert info["verifiable_score"].tolist() == CORRECT
    assert np.allclose(info["ngram"], ngram)
    assert np.array_equal(info["response_tokens"], lengths)
    assert np.allclose(info["length"], length)
    want = 0.5 * rubric + 2.0 * np.array(CORRECT) + 0.25 * np.array(FORMAT) + ngram + length
    assert np.allclose(info["score"], want, atol=1e-4)
    assert np.allclose(out["reward_tensor"].sum(1).numpy(), want, atol=1e-4)
    stats = mgr.last_batch_stats
    assert stats["reward/format/mean"] == pytest.approx(0.5)
    assert stats["reward/last_step_std"] == pytest.approx(want.std(), abs=1e-4)


@pytest.mark.parametrize("mode", ["replace", "add", "multiply", "weighted"])
def test_combine_shorthand_adds_only_the_verifiable_keys(load_manager, rm_server, verl_config, tokenizer, grpo_groups, mode):
    """``combine`` is a composition of rubric and verifiable: no rule keys, verifiable ones unless replace (verl's
    ``acc`` and, with its default scorer, ``pred``), the win keys (``pairwise=auto``: None outside validation)."""
    mgr = load_manager(verl_config(rm_server.url, combine=mode), tokenizer)
    info = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    keys = {"score", "rm_score", "rm_valid", "rm_prompt_tokens_dropped", "rm_tokens", "rm_latency_ms",
            "rm_weight_version", "rm_failovers", "win", "win_and", "ref_margin"}
    assert set(info) == (keys if mode == "replace" else keys | {"verifiable_score", "acc", "pred"})
    assert info["win"] == [None] * len(info["score"])
