"""The RM trainer's own ranks (``placement=separate``): on one node when one holds them, else over several (Ray's
simulated multi-node cluster); ranks Ray cannot place are a clear error naming each node's slots, never a silent
wait (verl waits for a resource pool's placement with no timeout; the RM's pool is placed here first, with one): the
split, in process (Ray's placement of it, on a real Ray cluster: tests/integration/online/test_placement.py)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.online.placement import rank_split


@pytest.mark.parametrize(("ranks", "capacities", "split"), [
    (2, [2, 2], [2]),  # one node holds them: one group, as verl places a pool
    (3, [2, 2], [2, 1]),
    (32, [8, 8, 8, 8], [8, 8, 8, 8]),  # a 70B full RM on four 8-GPU nodes (benchmarks/README)
    (5, [1, 4, 2], [4, 1]),  # the fullest nodes first
    (5, [2, 2], None),
    (1, [], None),
])
def test_ranks_go_on_one_node_when_one_holds_them_else_over_the_fullest(ranks, capacities, split):
    assert rank_split(ranks, capacities) == split
