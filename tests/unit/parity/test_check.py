"""``verl-vllm-rm check`` (``parity/check.py``) in-process: the probes it scores (the check against the real server:
tests/integration/parity/test_check.py)."""

from __future__ import annotations

from verl_vllm_rm.parity.check import probe_token_ids
from verl_vllm_rm.parity.corpus import STEP


def test_the_probes_are_the_corpus_lines_tokenized_for_a_seed(tokenizer):
    probes = probe_token_ids(tokenizer, 6, seed=4)
    assert len(probes) == 6 and all(isinstance(t, int) for ids in probes for t in ids)
    texts = [tokenizer.decode(ids) for ids in probes]
    assert all(t.startswith("What is ") and t.endswith(f". {STEP}") for t in texts)
    assert probe_token_ids(tokenizer, 6, seed=4) == probes and probe_token_ids(tokenizer, 6, seed=5) != probes
    assert [ids[-1] for ids in probes] == [tokenizer.convert_tokens_to_ids(STEP)] * 6
