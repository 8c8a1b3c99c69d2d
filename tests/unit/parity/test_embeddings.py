"""Embedding health (``parity/embeddings.py``): near-zero and identical rows of a model's embedding matrices."""

from __future__ import annotations

import torch

from verl_vllm_rm.parity.embeddings import EmbeddingReport, check_matrix, embedding_health


def test_embedding_health_flags_zero_and_identical_rows():
    torch.manual_seed(0)
    w = torch.randn(10, 8)
    assert check_matrix("e", w).ok
    w[3] = 0.0
    w[7] = w[5]
    report = check_matrix("e", w)
    assert report.near_zero_rows == [3] and report.identical_row_groups == [[5, 7]] and not report.ok
    assert check_matrix("e", w, ignore_rows=(3, 7)).ok
    w[8] = w[2] + 1e-4
    assert [2, 8] in check_matrix("e", w, identical_tol=1e-3, ignore_rows=(3, 7)).identical_row_groups


def test_a_reports_dict_lists_at_most_50_rows_and_groups_but_counts_all():
    w = torch.zeros(80, 4)
    report = check_matrix("e", w)
    assert report.near_zero_rows == list(range(80)) and report.identical_row_groups == []
    out = report.as_dict()
    assert out["near_zero_rows"] == list(range(50)) and out["rows"] == 80 and out["ok"] is False
    groups = EmbeddingReport("e", 200, [], [[i, i + 100] for i in range(60)])
    assert len(groups.as_dict()["identical_row_groups"]) == 50 and not groups.ok


def test_the_tiny_rms_only_zero_row_is_its_padding_token(hf_model, tokenizer):
    """A sequence classifier has no output embeddings: one report, of the input embeddings, whose one zero row is
    the pad token's (``verl-vllm-rm check`` ignores it)."""
    (report,) = embedding_health(hf_model)
    assert (report.name, report.rows) == ("input_embeddings", len(tokenizer))
    assert report.near_zero_rows == [tokenizer.pad_token_id] and report.identical_row_groups == []
    (ignoring_pad,) = embedding_health(hf_model, ignore_rows=(tokenizer.pad_token_id,))
    assert ignoring_pad.ok
