"""Rule-reward composition inside the manager (through verl's loader, real server)."""

import numpy as np
import pytest

from verl.trainer.ppo.reward import load_reward_manager
from verl_vllm_rm.scoring.options import ConfigError
from verl_vllm_rm.dev.grpo_batch import build_batch, row_token_ids
from verl_vllm_rm.parity.reference import sequence_scores
from verl_vllm_rm.rewards import format_reward, ngram_repetition_penalty

REWARDS = "{components:[rubric,verifiable,format,ngram,length],weights:{rubric:0.5,verifiable:2.0,format:0.25}," \
          "ngram:{ngram_size:2},length:{max_tokens:12,penalty_per_token:0.1}}"


def test_total_is_the_weighted_sum_of_components(rm_server, verl_config, tokenizer, hf_model, grpo_groups):
    mgr = load_reward_manager(verl_config(rm_server.url, rewards=REWARDS), tokenizer)
    out = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)
    info = {k: np.asarray(v, dtype=float) for k, v in out["reward_extra_info"].items()}
    rows = [(g, r) for g in grpo_groups for r in g.response_ids]
    texts = [tokenizer.decode(r, skip_special_tokens=True) for _, r in rows]
    lengths = np.array([len(r) for _, r in rows])
    padded = np.zeros((len(rows), lengths.max()), dtype=np.int64)
    for i, (_, r) in enumerate(rows):
        padded[i, : len(r)] = r
    rubric = np.array(sequence_scores(hf_model, [row_token_ids(g, r) for g, r in rows]))
    assert np.allclose(info["rm_score"], rubric, atol=1e-4)
    assert np.array_equal(info["format"], format_reward(texts))
    assert np.allclose(info["ngram"], ngram_repetition_penalty(padded, lengths, ngram_size=2))
    assert np.array_equal(info["response_tokens"], lengths)
    assert np.allclose(info["length"], -0.1 * np.maximum(lengths - 12, 0))
    want = 0.5 * rubric + 2.0 * info["verifiable_score"] + 0.25 * info["format"] + info["ngram"] + info["length"]
    assert np.allclose(info["score"], want, atol=1e-4)
    assert np.allclose(out["reward_tensor"].sum(1).numpy(), want, atol=1e-4)
    stats = mgr.last_batch_stats
    assert stats["reward/format/mean"] == pytest.approx(info["format"].mean())
    assert stats["reward/last_step_std"] == pytest.approx(info["score"].std(), abs=1e-5)


@pytest.mark.parametrize("mode", ["replace", "add", "multiply", "weighted"])
def test_combine_shorthand_adds_only_the_verifiable_keys(rm_server, verl_config, tokenizer, grpo_groups, mode):
    """``combine`` is a composition of rubric and verifiable: no rule keys, verifiable ones unless replace."""
    mgr = load_reward_manager(verl_config(rm_server.url, combine=mode), tokenizer)
    info = mgr(build_batch(grpo_groups, tokenizer.pad_token_id), return_dict=True)["reward_extra_info"]
    keys = {"score", "rm_score", "rm_valid", "rm_prompt_tokens_dropped"}
    assert set(info) == (keys if mode == "replace" else keys | {"verifiable_score"})


@pytest.mark.parametrize(
    "rewards,extra,needle",
    [
        ("{components:[rubric,style]}", {}, "style"),
        ("{components:[rubric,ngram],ngram:{ngram_size:-2}}", {}, "ngram_size"),
        ("{components:[rubric],weights:{format:1.0}}", {}, "not enabled"),
        ("{components:[rubric,verifiable]}", {"combine": "add"}, "are exclusive"),
    ],
)
def test_composition_config_errors_are_clear(verl_config, tokenizer, rewards, extra, needle):
    with pytest.raises(ConfigError, match=needle):
        load_reward_manager(verl_config("http://127.0.0.1:1", rewards=rewards, **extra), tokenizer)
