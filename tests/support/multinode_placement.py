"""The RM trainer's ranks placed on Ray's simulated multi-node cluster (``ray.cluster_utils.Cluster``: two nodes of
two CPUs in this process's own Ray, apart from any test's): a subprocess, so it never meets the session's Ray. Run
it with a ``RAY_TMPDIR`` of its own: the Cluster advertises its address there for any ``ray.init()`` to join.

Usage: multinode_placement.py RANKS... ; prints ``RESULT {ranks: {"split", "nodes"} | {"error"}}`` as JSON, where
``nodes`` lists, per placement group, the node ids its bundles landed on.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table, remove_placement_group

    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.placement import RewardModelPlacementError, place_rm_ranks

    # no dashboard: Ray's Cluster starts one by default, nine head processes beside the test's own on 2 cores
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    out = {}
    try:
        for ranks in map(int, sys.argv[1:]):
            config = OnlineRMConfig.from_dict({"model_path": "/rm", "server_url": "http://rm:1", "use_gpu": False,
                                               "num_workers": ranks, "placement_timeout_s": 120.0})
            try:
                split, groups = place_rm_ranks(config, f"rm_{ranks}")
            except RewardModelPlacementError as e:
                out[ranks] = {"error": str(e)}
                continue
            out[ranks] = {"split": split,
                          "nodes": [sorted(set(placement_group_table(g)["bundles_to_node_id"].values()))
                                    for g in groups]}
            for group in groups:
                remove_placement_group(group)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
