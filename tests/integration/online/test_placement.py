"""The RM trainer's own ranks (``placement=separate``): on one node when one holds them, else over several (Ray's
simulated multi-node cluster); ranks Ray cannot place are a clear error naming each node's slots, never a silent
wait (verl waits for a resource pool's placement with no timeout; the RM's pool is placed here first, with one)."""

from __future__ import annotations

import pytest

from repo_paths import SUPPORT

from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.placement import RewardModelPlacementError, place_rm_ranks


BASE = {"model_path": "/rm", "server_url": "http://rm:1"}


@pytest.mark.parametrize(("options", "message"), [
    ({"num_workers": 64, "use_gpu": False}, r"asks Ray for 64 rank\(s\) of \{'CPU': 1\} \(\+online_rm.num_workers=64, "
                                             r"use_gpu=False\) and the cluster has too little CPU in all; the cluster "
                                             r"has CPU \d+ free of 16 \(nodes: [\d.]+ \(\w+\): CPU \d+ free of 16\)\. "
                                             r"Lower \+online_rm.num_workers"),
    ({"num_workers": 1, "use_gpu": True}, r"of \{'CPU': 1, 'GPU': 1\} .* too little GPU in all; the cluster has CPU "
                                           r"\d+ free of 16, GPU 0 free of 0 \(nodes: .*GPU 0 free of 0\)\..*placement=colocated"),
])
def test_rm_ranks_the_cluster_cannot_hold_are_refused_at_once(ray_cluster, options, message):
    with pytest.raises(RewardModelPlacementError, match=message):
        place_rm_ranks(OnlineRMConfig.from_dict({**BASE, **options}), "rm_too_big")


def test_rm_ranks_held_by_other_pools_time_out_naming_them_and_leave_nothing_behind(ray_cluster):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    hog = placement_group([{"CPU": ray.available_resources()["CPU"]}])  # as verl's pools holding every slot
    ray.get(hog.ready())
    config = OnlineRMConfig.from_dict({**BASE, "use_gpu": False, "placement_timeout_s": 1.0})
    with pytest.raises(RewardModelPlacementError, match=r"were not free within online_rm.placement_timeout_s=1: "
                                                        r"other pools .* hold them; the cluster has CPU 0 free of 16"):
        place_rm_ranks(config, "rm_waits")
    remove_placement_group(hog)  # Ray frees the hog's slots asynchronously: wait for the group, not for a duration
    split, groups = place_rm_ranks(OnlineRMConfig.from_dict({**BASE, "use_gpu": False, "placement_timeout_s": 120.0}),
                                   "rm_fits")  # the refused request left nothing pending in front of this one
    assert split == [1] and len(groups) == 1
    remove_placement_group(groups[0])


def test_ranks_no_node_holds_are_placed_over_the_nodes_of_a_multi_node_cluster():
    """Ray's simulated cluster of two 2-CPU nodes (in a subprocess: a Ray of its own): 2 ranks on one node, 3 over
    both (2 + 1, a group a node), 5 refused at once naming each node's free slots."""
    import json
    import os
    import re
    import subprocess
    import sys
    import tempfile

    script = SUPPORT / "multinode_placement.py"
    # Ray's Cluster writes its address into $RAY_TMPDIR/ray_current_cluster "so that ray.init() connects to it":
    # in the shared /tmp/ray, a main_ppo starting meanwhile on the other worker joined it and died (a fresh clone's
    # recipe run, exit before any step). Its own directory keeps it to itself.
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as ray_tmp:
        proc = subprocess.run([sys.executable, str(script), "2", "3", "5"], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "RAY_TMPDIR": ray_tmp})
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
