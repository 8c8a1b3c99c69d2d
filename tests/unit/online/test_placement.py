"""The RM trainer's own ranks (``placement=separate``): on one node when one holds them, else over several (Ray's
simulated multi-node cluster); ranks Ray cannot place are a clear error naming each node's slots, never a silent
wait (verl waits for a resource pool's placement with no timeout; the RM's pool is placed here first, with one): the in-process tests (no server; those on the real server: tests/integration/online/test_placement.py)."""

from __future__ import annotations
import pytest
from verl_vllm_rm.online.placement import rank_split
from repo_paths import SUPPORT


def test_the_rm_ranks_store_port_window_lies_below_the_ephemeral_range():
    """The RM ranks' torch.distributed store listens on a port no outgoing connection can be given as its source
    (a port taken that way failed a worker's start with EADDRINUSE); windows drawn for two groups differ."""
    import random
    from pathlib import Path

    from verl_vllm_rm.online.driver import master_port_range

    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    windows = [master_port_range(random.Random(seed)) for seed in range(50)]
    assert all(10000 <= low and high == low + 1000 and high <= ephemeral_low for low, high in windows)
    assert len({low for low, _ in windows}) > 40


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


def test_ranks_no_node_holds_are_placed_over_the_nodes_of_a_multi_node_cluster():
    """Ray's simulated cluster of two 2-CPU nodes (in a subprocess: a Ray of its own): 2 ranks on one node, 3 over
    both (2 + 1, a group a node), 5 refused at once naming each node's free slots."""
    import json
    import re
    import subprocess
    import sys

    script = SUPPORT / "multinode_placement.py"
    proc = subprocess.run([sys.executable, str(script), "2", "3", "5"], capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    placed = json.loads(lines[0].removeprefix("RESULT "))
    assert placed["2"]["split"] == [2] and len(placed["2"]["nodes"]) == 1 and len(placed["2"]["nodes"][0]) == 1
    assert placed["3"]["split"] == [2, 1]
    (first,), (second,) = placed["3"]["nodes"]  # each group on one node, the two on different nodes
    assert first != second
    # the free counts are what Ray reports when asked (it gives the groups above back asynchronously)
    assert re.fullmatch(
        r"the online RM trainer asks Ray for 5 rank\(s\) of \{'CPU': 1\} \(\+online_rm.num_workers=5, use_gpu=False\) "
        r"and the cluster has too little CPU in all; the cluster has CPU [0-4] free of 4 \(nodes: "
        r"[\d.]+ \(\w{8}\): CPU [0-2] free of 2; [\d.]+ \(\w{8}\): CPU [0-2] free of 2\)\. Lower \+online_rm.num_workers, "
        r"give Ray more resources, or set \+online_rm.placement=colocated \(one RM rank beside each actor rank\)",
        placed["5"]["error"]), placed["5"]["error"]
