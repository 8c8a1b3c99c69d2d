"""The routing layer's own cost per request: a client over managed replicas against fixed server URLs, in one run.

Two ``zero_compute_server`` processes (BENCHMARK FIXTURE: ``/score`` answered without model
compute, so the client's own time is what shows) stand for two replicas. Per repetition, in
a new random order, the same sequential ``/score`` requests (one 64-token input each) go
through ``VLLMRewardClient``:

* (fixed_1) one URL; (fixed_2) two URLs (least-outstanding routing);
* (followed_2) two URLs from a source, as managed replicas give them: the source is a real Ray
  actor's ``urls()`` (the fleet's method), asked again every ``refresh_s`` (1 s, the client's
  default) while requests go on.

It also times the pieces alone: one ``_pick`` (the routing decision), one ``_refresh`` when no
new list is due (the per-request check), and one Ray ``urls()`` round trip (what a refresh costs,
once a second per reward-loop worker).

With ``--publish``: publish time of one RM update (``full``, the tiny RM, and a 100M-parameter
one) to one real vLLM-CPU server, and to two with the two-phase commit (``MultiServerPublisher``:
both stage in parallel threads, then both apply), against two single-server publishes one after
the other; and the transport alone (bare gloo receivers, no server, the 100M RM's bytes in the publisher's
buckets): one group with both replicas as receivers against two groups of two sending in parallel (the
fleet's way), with one receiver as the baseline. Writes ``benchmarks/results/replicas.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(RESULTS.parent))


class UrlActor:
    """The shape of ``ReplicaFleet.urls`` without servers to start: a Ray actor answering a list of URLs."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = urls

    def urls(self) -> list[str]:
        return self._urls


async def requests_per_s(client, n: int) -> float:
    item = [list(range(1, 65))]
    t0 = time.perf_counter()
    for _ in range(n):
        await client.score_request(item)
    return (time.perf_counter() - t0) / n


def per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def bench_publish(reps: int) -> dict:
    """Seconds per publish (median of ``reps``, versions counting up) to 1 server, to 2 with the two-phase
    commit, and to 2 one after the other."""
    import tempfile

    import torch
    from transformers import AutoModelForSequenceClassification

    from verl_vllm_rm.dev.tiny_rm import RM_100M, TinyRMSpec, build_tiny_rm
    from verl_vllm_rm.replicas.launcher import running_server
    from verl_vllm_rm.weight_sync import MultiServerPublisher

    specs = {"tiny": TinyRMSpec(), "100m": RM_100M}
    args = ["--dtype", "float32", "--max-model-len", "512", "--enable-weight-updates"]
    out = {}
    with tempfile.TemporaryDirectory() as work:
        for name, spec in specs.items():
            path = build_tiny_rm(Path(work) / name, spec)
            model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
            nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
            with running_server(path, args) as a, running_server(path, args) as b:
                times = {"one_server": [], "two_two_phase": [], "two_one_after_the_other": []}
                # one session per server at a time: the single-server publishers first, then the pair
                with MultiServerPublisher([a.url], timeout_s=300) as one, \
                        MultiServerPublisher([b.url], timeout_s=300) as other:
                    version = max(one.version, other.version)
                    for _ in range(reps):
                        version += 1
                        t0 = time.perf_counter()
                        one.publish(model, version, "full")
                        times["one_server"].append(time.perf_counter() - t0)
                        version += 1
                        t0 = time.perf_counter()
                        one.publish(model, version, "full")
                        other.publish(model, version, "full")
                        times["two_one_after_the_other"].append(time.perf_counter() - t0)
                with MultiServerPublisher([a.url, b.url], timeout_s=300) as both:
                    for _ in range(reps):
                        version += 1
                        t0 = time.perf_counter()
                        both.publish(model, version, "full")
                        times["two_two_phase"].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            out[name] = {"bytes": nbytes, "median_s": med, "all_s": times,
                         "two_phase_over_one": med["two_two_phase"] / med["one_server"],
                         "two_phase_over_one_after_the_other": med["two_two_phase"] / med["two_one_after_the_other"]}
    return out


def bench_transport(reps: int, nbytes: int = 406 << 20) -> dict:
    """Seconds per send of ``nbytes`` (median of ``reps`` after a warm-up) over gloo: to one receiver, to two
    in one group (a broadcast with both as receivers), and to two over two groups in parallel threads."""
    import threading

    from bench_weight_sync import raw_broadcast_s

    from verl_vllm_rm.protocol.wire import DEFAULT_BUCKET_BYTES

    sizes = [DEFAULT_BUCKET_BYTES] * (nbytes // DEFAULT_BUCKET_BYTES) + [nbytes % DEFAULT_BUCKET_BYTES]
    sizes = [n for n in sizes if n]
    one = raw_broadcast_s("gloo", sizes, reps + 1)[1:]
    one_group = raw_broadcast_s("gloo", sizes, reps + 1, receivers=2)[1:]
    pair: list[list[float]] = [[], []]
    rounds = threading.Barrier(2)  # both groups send each round together

    def send(i: int) -> None:
        pair[i] = raw_broadcast_s("gloo", sizes, reps + 1, round_start=rounds.wait)[1:]

    threads = [threading.Thread(target=send, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = [max(a, b) for a, b in zip(*pair)]  # a round ends when both groups have sent it
    med = {"one_receiver": statistics.median(one), "one_group_two_receivers": statistics.median(one_group),
           "two_groups_in_parallel": statistics.median(parallel)}
    return {"bytes": nbytes, "buckets": len(sizes), "median_s": med,
            "all_s": {"one_receiver": one, "one_group_two_receivers": one_group, "two_groups_in_parallel": parallel},
            "one_group_over_parallel": med["one_group_two_receivers"] / med["two_groups_in_parallel"]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per path and repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--publish", action="store_true", help="also time publishes to 1 and 2 real servers")
    parser.add_argument("--out", default=str(RESULTS / "replicas.json"))
    args = parser.parse_args(argv)

    import ray
    from zero_compute_server import zero_compute_server

    from verl_vllm_rm.client.reward_client import VLLMRewardClient

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with zero_compute_server() as a, zero_compute_server() as b:
        actor = ray.remote(UrlActor).remote([a, b])

        async def follow_source() -> list[str]:
            return await actor.urls.remote()

        def followed() -> VLLMRewardClient:
            client = VLLMRewardClient()
            client.follow(follow_source)
            return client

        paths = {"fixed_1": lambda: VLLMRewardClient([a]), "fixed_2": lambda: VLLMRewardClient([a, b]),
                 "followed_2": followed}
        times: dict[str, list[float]] = {name: [] for name in paths}

        async def one_rep(order: list[str]) -> None:
            for name in order:
                client = paths[name]()
                await requests_per_s(client, 50)  # warm: session, connections, the source's first answer
                times[name].append(await requests_per_s(client, args.requests))
                await client.close()

        for _ in range(args.reps):
            order = list(paths)
            random.shuffle(order)
            asyncio.run(one_rep(order))

        async def pieces() -> dict[str, float]:
            client = followed()
            await requests_per_s(client, 5)
            pick = per_call_us(client._pick, 100_000)
            t0 = time.perf_counter()
            for _ in range(100_000):
                await client._refresh()
            refresh = (time.perf_counter() - t0) / 100_000 * 1e6
            t0 = time.perf_counter()
            for _ in range(200):
                await actor.urls.remote()
            ray_call = (time.perf_counter() - t0) / 200 * 1e6
            await client.close()
            return {"pick_us": pick, "refresh_check_us": refresh, "ray_urls_call_us": ray_call}

        parts = asyncio.run(pieces())
    ray.shutdown()

    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    result = {
        "machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
        "requests_per_path": args.requests, "reps": args.reps,
        "per_request_ms_median": med,
        "per_request_ms_all": {name: [x * 1e3 for x in v] for name, v in times.items()},
        "routing_cost_us": {"followed_2_minus_fixed_2": (med["followed_2"] - med["fixed_2"]) * 1e3,
                            "fixed_2_minus_fixed_1": (med["fixed_2"] - med["fixed_1"]) * 1e3},
        "pieces_us": parts,
        "refresh_share_per_request_us": parts["ray_urls_call_us"] / (1.0 / (med["followed_2"] / 1e3)),
        "publish_to_replicas": bench_publish(args.reps) if args.publish else "not run (--publish)",
        "transport_to_two": bench_transport(args.reps) if args.publish else "not run (--publish)",
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "per_request_ms_all"}, indent=1))
    return result


if __name__ == "__main__":
    main()
