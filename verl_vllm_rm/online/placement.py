"""Where the RM trainer's own ranks run (``placement=separate``): one node when one can hold them, else several.

verl places each pool as one ``STRICT_PACK`` placement group a node (``RayResourcePool(process_on_nodes)``), and
waits for it with no timeout. The RM's pool is placed here the same way, first and with a bound: its ranks split
over the nodes when no node holds them all (a 70B ``full`` RM on 32 ranks is four 8-GPU nodes), one group a node.
"""

from __future__ import annotations

from typing import Any, Sequence

from verl_vllm_rm.online.config import OnlineRMConfig


class RewardModelPlacementError(RuntimeError):
    """Ray cannot place the RM trainer's ranks (``placement=separate``)."""


def rank_split(ranks: int, capacities: Sequence[int]) -> list[int] | None:
    """How many ranks go on each node: all on one when a node can hold them (as verl places a pool), else over the
    nodes that hold the most, the fullest first; ``None`` when all the nodes together cannot hold them."""
    if ranks <= max(capacities, default=0):
        return [ranks]
    split, left = [], ranks
    for capacity in sorted(capacities, reverse=True):
        if left == 0:
            break
        if capacity > 0:
            split.append(min(capacity, left))
            left -= split[-1]
    return split if left == 0 else None


def _nodes(bundle: dict[str, float]) -> list[tuple[str, dict[str, float], dict[str, float]]]:
    """Each alive node's address, its resources in all and free now (for the bundle's keys)."""
    import ray
    # Ray's per-node views (ray.available_resources() sums the nodes); verl reads ray._private.state too
    from ray._private.state import available_resources_per_node, total_resources_per_node

    address = {node["NodeID"]: f"{node['NodeManagerAddress']} ({node['NodeID'][:8]})" for node in ray.nodes()
               if node["Alive"]}
    totals, free = total_resources_per_node(), available_resources_per_node()
    return [(address[node], {k: totals[node].get(k, 0.0) for k in bundle}, {k: free.get(node, {}).get(k, 0.0)
                                                                          for k in bundle})
            for node in sorted(totals, key=lambda n: address.get(n, "")) if node in address]


def place_rm_ranks(config: OnlineRMConfig, name: str) -> tuple[list[int], list[Any]]:
    """The ranks on each node and the placement groups of the RM's own pool (one bundle a rank, one group a node),
    or a :class:`RewardModelPlacementError` naming what was asked and what each node has: at once when the nodes
    cannot hold the ranks, after ``placement_timeout_s`` when other pools (verl's) hold what they need."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from verl.utils.device import get_resource_name

    bundle = {"CPU": 1, **({get_resource_name(): 1} if config.use_gpu else {})}
    asked = {key: value * config.num_workers for key, value in bundle.items()}
    nodes = _nodes(bundle)

    def error(why: str) -> RewardModelPlacementError:
        total, free = ray.cluster_resources(), ray.available_resources()
        have = ", ".join(f"{key} {free.get(key, 0):g} free of {total.get(key, 0):g}" for key in asked)
        each = "; ".join(f"{address}: " + ", ".join(f"{key} {node_free[key]:g} free of {node_total[key]:g}"
                                                     for key in asked) for address, node_total, node_free in nodes)
        return RewardModelPlacementError(
            f"the online RM trainer asks Ray for {config.num_workers} rank(s) of {bundle} (+online_rm.num_workers="
            f"{config.num_workers}, use_gpu={config.use_gpu}) and {why}; the cluster has {have} (nodes: {each}). "
            "Lower +online_rm.num_workers, give Ray more resources, or set +online_rm.placement=colocated (one RM "
            "rank beside each actor rank)")

    capacities = [int(min(node_total[key] // value for key, value in bundle.items())) for _, node_total, _ in nodes]
    split = rank_split(config.num_workers, capacities)
    if split is None:
        short = [key for key, value in asked.items() if sum(node[1][key] for node in nodes) < value]
        raise error(f"the cluster has too little {', '.join(short)} in all" if short else
                    f"no split of them over its nodes fits (a rank's bundle on one node; the nodes hold {capacities})")
    groups = [placement_group([bundle] * ranks, strategy="STRICT_PACK", name=f"{name}_rm_ranks_{i}")
              for i, ranks in enumerate(split)]
    ready, _ = ray.wait([group.ready() for group in groups], num_returns=len(groups),
                        timeout=config.placement_timeout_s)
    if len(ready) < len(groups):
        for group in groups:
            remove_placement_group(group)
        raise error(f"they were not free within online_rm.placement_timeout_s={config.placement_timeout_s:g}: "
                    "other pools (verl's actor, rollout, reward workers) hold them")
    return split, groups

