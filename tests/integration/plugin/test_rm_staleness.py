"""``+online_rm.max_staleness`` (``plugin/rm_staleness.py``): verl's own asynchronous replay buffer, evicting groups
scored by the trained RM below the floor.

verl's buffer reads TransferQueue through its module-level ``kv_list``/``kv_batch_get``/``kv_clear``, and
TransferQueue runs only on Ray; here those three answer from a dict shaped as verl's agent loop fills it (prompt keys
``{uid}`` tagged ``is_prompt``/``status``/``global_steps``, trajectory keys ``{uid}_{session}_0`` with
``extra_fields.reward_extra_info``), so the real classes (verl's ``ReplayBufferAsync`` code, this package's
subclass) run as in a run; the last test runs them on a real TransferQueue (on Ray). Bounded staleness in a real
async ``main_ppo`` run is for a main_ppo test (none yet).
"""

from __future__ import annotations

import pytest
from staleness_buffers import make_buffer


@pytest.mark.ray
def test_on_a_real_transfer_queue_a_stale_group_is_cleared_and_the_rest_sampled(queue):
    """TransferQueue as verl's agent loop fills it (``tq_helpers.put_trajectories``; the prompt tags as verl's
    trainer puts them): the versions are read from its ``extra_fields`` and the stale group leaves it."""
    from tq_helpers import put_trajectories

    groups = {"staleq": [([1, 2], [3], 1.0), ([1, 2], [4], 0.0)], "freshq": [([5, 6], [7], 1.0), ([5, 6], [8], 0.0)]}
    infos = {"staleq": [{"rm_weight_version": 2.0}, {"rm_weight_version": 3.0}],
             "freshq": [{"rm_weight_version": 3.0}, {"rm_weight_version": 3.0}]}
    put_trajectories(queue, groups, infos)
    queue.kv_batch_put(keys=list(groups), partition_id="train",
                       tags=[{"is_prompt": True, "status": "finished", "global_steps": 1}] * len(groups))
    refills = []
    buffer = make_buffer(max_staleness=1, refills=refills)
    buffer.published(3)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert metrics == {"training/rm_staleness/evicted_samples": 1} and refills == [1]
    assert sorted(batch.keys) == ["freshq_0_0", "freshq_1_0"]
    assert not [key for key in queue.kv_list("train").get("train", {}) if key.startswith("staleq")]
    queue.kv_clear(keys=batch.keys, partition_id="train")
