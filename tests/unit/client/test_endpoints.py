"""The reward client's view of its servers (``client/endpoints.py``): which servers it routes to by the weight
version each is known to serve, and one server's figures. Pure logic over data."""

from __future__ import annotations

import math

from verl_vllm_rm.client.endpoints import Endpoint, endpoint_stats, on_newest_version


def endpoint(name: str, version: int | None, read_at: float = -math.inf) -> Endpoint:
    return Endpoint(f"http://{name}", version=version, version_read=read_at)


def names(endpoints: list[Endpoint]) -> list[str]:
    return [e.url.removeprefix("http://") for e in endpoints]


def test_servers_whose_version_is_not_known_are_routed():
    routable, to_check = on_newest_version([endpoint("a", None), endpoint("b", None)], -math.inf, 10.0, 5.0)
    assert (names(routable), to_check) == (["a", "b"], [])


def test_a_server_behind_gets_no_request_until_its_health_is_due():
    """b was seen on version 2 after a was first seen on 3 (at t=5): behind, and its version was read at t=6, so
    it is asked again only 5 s later; one read before a showed version 3 is due at once."""
    servers = [endpoint("a", 3, read_at=9.0), endpoint("b", 2, read_at=6.0), endpoint("c", None)]
    assert [names(x) for x in on_newest_version(servers, 5.0, 10.0, 5.0)] == [["a", "c"], []]
    assert [names(x) for x in on_newest_version(servers, 5.0, 11.5, 5.0)] == [["a", "c"], ["b"]]
    servers[1].version_read = 4.0  # read before a was seen on version 3
    assert [names(x) for x in on_newest_version(servers, 5.0, 10.0, 5.0)] == [["a", "c"], ["b"]]


def test_the_newest_version_is_that_of_the_servers_up():
    """Without the server on version 3 (down, so not passed), the one on 2 is the newest: it serves."""
    assert names(on_newest_version([endpoint("b", 2, read_at=6.0)], 5.0, 10.0, 5.0)[0]) == ["b"]
    restarted = [endpoint("a", 0, read_at=9.0), endpoint("b", 0, read_at=9.5)]  # both restarted from disk
    assert names(on_newest_version(restarted, 5.0, 10.0, 5.0)[0]) == ["a", "b"]


def test_a_servers_figures_say_its_mean_latency_and_the_cooldown_left():
    e = Endpoint("http://a", requests=4, failures=1, busy_s=2.0, failovers=1, hangs=1, outstanding=2, down_until=12.5)
    assert endpoint_stats(e, now=10.0) == {"requests": 4, "outstanding": 2, "failures": 1, "failovers": 1, "hangs": 1,
                                           "latency_ms": 500.0, "cooldown_left_s": 2.5}
    assert endpoint_stats(e, now=13.0)["cooldown_left_s"] == 0.0
    assert endpoint_stats(Endpoint("http://b"), now=0.0)["latency_ms"] == 0.0  # nothing sent: no division
