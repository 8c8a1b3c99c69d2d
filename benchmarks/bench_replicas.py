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
once a second per reward-loop worker). Writes ``benchmarks/results/replicas.json``.
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per path and repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "replicas.json"))
    args = parser.parse_args(argv)

    import ray
    from zero_compute_server import zero_compute_server

    from verl_vllm_rm.scoring.client import VLLMRewardClient

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
        "publish_to_replicas": "not measured: weight updates reach one server until the two-phase commit to every "
                               "replica lands (issue 14)",
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "per_request_ms_all"}, indent=1))
    return result


if __name__ == "__main__":
    main()
