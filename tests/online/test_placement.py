"""The RM trainer's own ranks (``placement=separate``) that Ray cannot place: a clear error, never a silent wait.

verl waits for a resource pool's placement with no timeout; the RM's pool is placed here first, with one."""

from __future__ import annotations

import pytest

from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.online.driver import RewardModelPlacementError, place_rm_ranks

BASE = {"model_path": "/rm", "server_url": "http://rm:1"}


@pytest.mark.parametrize(("options", "message"), [
    ({"num_workers": 64, "use_gpu": False}, r"asks Ray for 64 rank\(s\) of \{'CPU': 1\} \(\+online_rm.num_workers=64, "
                                             r"use_gpu=False\) and the cluster has too little CPU in all; the cluster "
                                             r"has CPU \d+ free of 16\. Lower \+online_rm.num_workers"),
    ({"num_workers": 1, "use_gpu": True}, r"of \{'CPU': 1, 'GPU': 1\} .* too little GPU in all; the cluster has CPU "
                                           r"\d+ free of 16, GPU 0 free of 0\..*placement=colocated"),
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
    group = place_rm_ranks(OnlineRMConfig.from_dict({**BASE, "use_gpu": False, "placement_timeout_s": 120.0}),
                           "rm_fits")  # the refused request left nothing pending in front of this one
    remove_placement_group(group)


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
