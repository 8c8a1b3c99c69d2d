"""Our ngram, length and format rewards against rm-gallery's on one shared corpus.

Where the definitions coincide the numbers must be equal; where they differ
(documented in each module) the difference must be exactly the documented one.
Counting units are aligned for the comparison: rm-gallery's n-gram reward splits
lower-cased text on whitespace, so words become our token ids; its length
penalty counts characters, so characters become our tokens.
"""

from __future__ import annotations

import numpy as np
import pytest
from rm_gallery.core.data.schema import DataOutput, DataSample, Step
from rm_gallery.core.model.message import MessageRole
from rm_gallery.core.reward.registry import RewardRegistry

from verl_vllm_rm.rewards import band_penalty, format_reward, ngram_counts, ngram_repetition_penalty

N = 5


def gallery_results(name: str, texts: list[str], **params) -> list[tuple[float, dict]]:
    """(score, extra_data) per text from rm-gallery's reward ``name``."""
    reward = RewardRegistry.get(name)(**params)
    out = []
    for i, text in enumerate(texts):
        answer = Step(role=MessageRole.ASSISTANT, content=text)
        sample = DataSample(unique_id=str(i), output=[DataOutput(answer=answer)])
        answer = reward.evaluate(sample).output[0].answer
        out.append((answer.reward.score, answer.additional_kwargs[reward.name]))
    return out


def words_as_ids(texts: list[str], padded) -> tuple[np.ndarray, np.ndarray]:
    """rm-gallery's 'simple' tokenization (strip, lower, split), one id per distinct word."""
    vocab: dict[str, int] = {}
    rows = [[vocab.setdefault(w, len(vocab)) for w in t.strip().lower().split()] for t in texts]
    return padded(rows)


def gallery_ngram(texts: list[str], min_scaling: float):
    return gallery_results("ngram_repetition_penalty", texts, n=N, use_soft_penalty=True, max_penalty=-1.0,
                           min_scaling=min_scaling, tokenizer_type="simple")


def test_ngram_counts_are_identical(corpus, padded):
    distinct, total = ngram_counts(*words_as_ids(corpus, padded), ngram_size=N)
    compared = 0
    for i, (_, extra) in enumerate(gallery_ngram(corpus, 0.0)):
        if "total_ngrams" in extra:  # rm-gallery returns early, without counts, below N words
            assert (distinct[i], total[i]) == (extra["unique_ngrams"], extra["total_ngrams"]), corpus[i]
            compared += 1
        else:
            assert total[i] == 0
    assert compared > 40 and (total > distinct).sum() > 10  # many texts, many with repeats


def test_ngram_penalty_differs_only_by_the_documented_normalisation(corpus, padded):
    """rm-gallery's rate is (T-U)/T, ours (T-U)/(T-1): with min_scaling 0, theirs = ours * (T-1)/T."""
    ours = ngram_repetition_penalty(*words_as_ids(corpus, padded), ngram_size=N, min_scaling=0.0)
    for i, (theirs, extra) in enumerate(gallery_ngram(corpus, 0.0)):
        total = extra.get("total_ngrams", 0)
        expected = ours[i] * (total - 1) / total if total >= 2 else ours[i]
        assert theirs == pytest.approx(expected, abs=1e-12), corpus[i]


def test_ngram_penalty_agrees_where_nothing_exceeds_min_scaling(corpus, padded):
    ours = ngram_repetition_penalty(*words_as_ids(corpus, padded), ngram_size=N, min_scaling=0.1)
    theirs = np.array([score for score, _ in gallery_ngram(corpus, 0.1)])
    both_tolerated = (ours == 0) & (theirs == 0)
    assert both_tolerated.sum() > 20
    assert (theirs[~both_tolerated] < 0).all() and (ours[~both_tolerated] < 0).all()
    assert (ours <= theirs + 1e-12).all()  # ours reaches max_penalty, theirs stops short of it


def test_length_penalty_identical_when_counting_characters(corpus):
    theirs = [score for score, _ in gallery_results("length_penalty", corpus)]  # min 10, max 1000, rate 0.01
    ours = band_penalty([len(t) for t in corpus], min_tokens=10, max_tokens=1000, penalty_per_token=0.01)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    kinds = {("short" if len(t) < 10 else "long" if len(t) > 1000 else "in band", v < 0)
             for t, v in zip(corpus, theirs)}
    assert kinds == {("short", True), ("long", True), ("in band", False)}


def test_format_agrees_except_when_the_answer_does_not_follow_the_thought(corpus):
    theirs = np.array([score for score, _ in gallery_results("reasoning_format", corpus)])
    ours = format_reward(corpus)
    differ = [corpus[i] for i in np.flatnonzero(ours != theirs)]
    assert differ == [
        "<answer>answer first</answer> then <think>thinking</think>",
        "<think>outer <answer>nested</answer> still thinking</think>",
    ]
    agree = ours == theirs
    assert set(ours[agree]) == {0.0, 1.0}
