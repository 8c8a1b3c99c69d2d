"""The RM trainer on verl's training engine, 1 and 2 ranks, ``full`` and ``lora``, on the same pairs: the in-process tests (no server; those on the real server: tests/integration/online/test_engine_trainer.py)."""

from __future__ import annotations


def test_micro_batches_split_a_ranks_pairs_evenly_and_never_exceed_the_option():
    from verl_vllm_rm.online.worker import micro_batch_pairs

    assert [micro_batch_pairs(pairs, 4) for pairs in (1, 4, 6, 7, 8, 12)] == [1, 4, 3, 1, 4, 4]
    assert micro_batch_pairs(6, 1) == 1
