"""N-gram repetition penalty (``rewards/ngram.py``): known answers, a brute-force reference, padding, errors, and
rm-gallery's ``ngram_repetition_penalty`` on one shared corpus (equal counts; penalties that differ only by the
documented normalisation). Counting units are aligned for the comparison: rm-gallery's n-gram reward splits
lower-cased text on whitespace, so words become our token ids."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from verl_vllm_rm.rewards import ngram_counts, ngram_repetition_penalty


def reference_penalty(tokens: list[int], n: int, max_penalty: float, min_scaling: float) -> float:
    """The docstring formula, one response at a time, with Python tuples (no hashing)."""
    windows = Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    total, distinct = sum(windows.values()), len(windows)
    rate = (total - distinct) / (total - 1) if total >= 2 else 0.0
    return max_penalty * min(max((rate - min_scaling) / (1 - min_scaling), 0.0), 1.0)


def penalty_of(tokens: list[int], padded, **kw) -> float:
    ids, lengths = padded([tokens])
    return float(ngram_repetition_penalty(ids, lengths, **kw)[0])


def test_defaults_match_the_rm_gallery_recipe():
    ids = np.full((1, 20), 3)
    assert ngram_repetition_penalty(ids, [20])[0] == -1.0  # max_penalty -1.0
    # 30 tokens = "a b c d e" six times: 26 windows, 5 distinct -> r = 21/25; min_scaling 0.1
    periodic = np.tile(np.arange(5), 6)[None]
    assert ngram_repetition_penalty(periodic, [30])[0] == pytest.approx(-(21 / 25 - 0.1) / 0.9)


@pytest.mark.parametrize("tokens", [[], [7], [1, 2, 3, 4], [1, 2, 3, 4, 5]], ids=["empty", "1", "4", "5"])
def test_fewer_than_two_windows_is_zero(tokens, padded):
    assert penalty_of(tokens, padded) == 0.0


def test_no_repetition_is_zero(padded):
    assert penalty_of(list(range(500)), padded) == 0.0


@pytest.mark.parametrize("max_penalty", [-1.0, -2.5, 0.0])
def test_fully_repetitive_is_max_penalty(max_penalty, padded):
    assert penalty_of([9] * 64, padded, max_penalty=max_penalty) == max_penalty


def test_min_scaling_is_tolerated_and_continuous(padded):
    # 0..9 then 0..4: 11 windows, 10 distinct -> rate exactly 0.1
    tokens = list(range(10)) + list(range(5))
    assert penalty_of(tokens, padded, min_scaling=0.1) == 0.0
    assert penalty_of(tokens, padded, min_scaling=0.0) == pytest.approx(-0.1)
    assert penalty_of(tokens, padded, min_scaling=0.05) == pytest.approx(-(0.1 - 0.05) / 0.95)


def test_unicode_code_points(padded):
    text = "日本語のテキスト🙂🙂🙂🙂🙂🙂🙂🙂 ünïcödé ünïcödé ünïcödé"
    tokens = [ord(c) for c in text]
    expected = reference_penalty(tokens, 3, -1.0, 0.1)
    assert expected < 0
    assert penalty_of(tokens, padded, ngram_size=3) == pytest.approx(expected)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_batch_matches_bruteforce_reference(n):
    rng = np.random.default_rng(n)
    rows, width = 300, 80  # > one 128-row chunk; small vocab so that n-grams repeat
    ids = rng.integers(0, 3 + n, size=(rows, width))
    ids[::7] = rng.integers(0, 10**6, size=(len(ids[::7]), width))  # some rows without repeats
    lengths = rng.integers(0, width + 1, size=rows)
    got = ngram_repetition_penalty(ids, lengths, ngram_size=n)
    want = [reference_penalty(ids[i, : lengths[i]].tolist(), n, -1.0, 0.1) for i in range(rows)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    distinct, total = ngram_counts(ids, lengths, n)
    for i in range(rows):
        windows = [tuple(ids[i, j:j + n]) for j in range(lengths[i] - n + 1)]
        assert (distinct[i], total[i]) == (len(set(windows)), len(windows))


def test_padding_is_never_read(padded):
    rows = [[1, 2, 3, 1, 2, 3, 1, 2], [4] * 9, [], list(range(12))]
    base = ngram_repetition_penalty(*padded(rows, pad=0), ngram_size=2)
    for pad, width in ((1, 12), (4, 20), (-5, 40)):
        np.testing.assert_array_equal(ngram_repetition_penalty(*padded(rows, pad=pad, width=width), ngram_size=2), base)


def test_accepts_int32_and_torch_tensors(padded):
    import torch  # the manager passes verl tensors
    ids, lengths = padded([[5, 5, 5, 5, 5, 5, 5], [1, 2, 3, 4, 5, 6, 7]])
    want = ngram_repetition_penalty(ids, lengths)
    np.testing.assert_array_equal(ngram_repetition_penalty(ids.astype(np.int32), lengths.astype(np.int32)), want)
    np.testing.assert_array_equal(ngram_repetition_penalty(torch.as_tensor(ids), torch.as_tensor(lengths)), want)
    np.testing.assert_array_equal(want, [-1.0, 0.0])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ngram_size": 0}, "ngram_size must be a positive integer"),
        ({"ngram_size": -3}, "ngram_size must be a positive integer"),
        ({"ngram_size": 2.5}, "ngram_size must be a positive integer"),
        ({"ngram_size": True}, "ngram_size must be a positive integer"),
        ({"max_penalty": 0.5}, "max_penalty must be a finite number <= 0"),
        ({"max_penalty": float("nan")}, "max_penalty must be a finite number <= 0"),
        ({"min_scaling": 1.0}, r"min_scaling must be in \[0, 1\)"),
        ({"min_scaling": -0.1}, r"min_scaling must be in \[0, 1\)"),
    ],
)
def test_bad_parameters_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ngram_repetition_penalty(np.zeros((1, 4), dtype=np.int64), [4], **kwargs)


@pytest.mark.parametrize(
    "ids, lengths, message",
    [
        (np.arange(6), [6], r"token_ids must be a padded \[batch, max_len\] array, got shape \(6,\); stack the "
                            r"responses and pad them on the right"),
        (np.zeros((2, 4)), [4, 4], "token_ids must hold integer token ids, got dtype float64"),
        (np.zeros((2, 4), dtype=np.int64), [4], "one integer per row"),
        (np.zeros((2, 4), dtype=np.int64), [4, 5], r"lengths must lie in \[0, 4\]"),
        (np.zeros((2, 4), dtype=np.int64), [-1, 2], r"lengths must lie in \[0, 4\]"),
    ],
)
def test_bad_batches_are_named(ids, lengths, message):
    with pytest.raises(ValueError, match=message):
        ngram_repetition_penalty(ids, np.asarray(lengths))


# -- against rm-gallery's ngram_repetition_penalty ------------------------------------------------------------

N = 5


def words_as_ids(texts: list[str], padded) -> tuple[np.ndarray, np.ndarray]:
    """rm-gallery's 'simple' tokenization (strip, lower, split), one id per distinct word."""
    vocab: dict[str, int] = {}
    rows = [[vocab.setdefault(w, len(vocab)) for w in t.strip().lower().split()] for t in texts]
    return padded(rows)


def gallery_ngram(gallery_results, texts: list[str], min_scaling: float):
    return gallery_results("ngram_repetition_penalty", texts, n=N, use_soft_penalty=True, max_penalty=-1.0,
                           min_scaling=min_scaling, tokenizer_type="simple")


def test_ngram_counts_are_identical(corpus, padded, gallery_results):
    distinct, total = ngram_counts(*words_as_ids(corpus, padded), ngram_size=N)
    compared = 0
    for i, (_, extra) in enumerate(gallery_ngram(gallery_results, corpus, 0.0)):
        if "total_ngrams" in extra:  # rm-gallery returns early, without counts, below N words
            assert (distinct[i], total[i]) == (extra["unique_ngrams"], extra["total_ngrams"]), corpus[i]
            compared += 1
        else:
            assert total[i] == 0
    assert compared > 40 and (total > distinct).sum() > 10  # many texts, many with repeats


def test_ngram_penalty_differs_only_by_the_documented_normalisation(corpus, padded, gallery_results):
    """rm-gallery's rate is (T-U)/T, ours (T-U)/(T-1): with min_scaling 0, theirs = ours * (T-1)/T."""
    ours = ngram_repetition_penalty(*words_as_ids(corpus, padded), ngram_size=N, min_scaling=0.0)
    for i, (theirs, extra) in enumerate(gallery_ngram(gallery_results, corpus, 0.0)):
        total = extra.get("total_ngrams", 0)
        expected = ours[i] * (total - 1) / total if total >= 2 else ours[i]
        assert theirs == pytest.approx(expected, abs=1e-12), corpus[i]


def test_ngram_penalty_agrees_where_nothing_exceeds_min_scaling(corpus, padded, gallery_results):
    ours = ngram_repetition_penalty(*words_as_ids(corpus, padded), ngram_size=N, min_scaling=0.1)
    theirs = np.array([score for score, _ in gallery_ngram(gallery_results, corpus, 0.1)])
    both_tolerated = (ours == 0) & (theirs == 0)
    assert both_tolerated.sum() > 20
    assert (theirs[~both_tolerated] < 0).all() and (ours[~both_tolerated] < 0).all()
    assert (ours <= theirs + 1e-12).all()  # ours reaches max_penalty, theirs stops short of it
