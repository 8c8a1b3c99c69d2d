"""``MultiServerPublisher``: one publisher per server, kept between publishes, one result per server."""

import pytest
import requests
from sync_helpers import assert_parity, load_rm, reset_server, runtime_version

from verl_vllm_rm.client.http import HttpError
from verl_vllm_rm.dev.offline_bt import OfflineBradleyTerry
from verl_vllm_rm.online.trainable import prepare_reward_model
from verl_vllm_rm.weight_sync import MultiServerPublisher, WeightUpdateRefused


def test_each_publish_bumps_the_version_and_scores_like_the_model(ws_server, tiny_rm, probe_ids, preference_batch):
    version = reset_server(ws_server.url, tiny_rm)
    model = prepare_reward_model(load_rm(tiny_rm), "head_only")
    trainer = OfflineBradleyTerry(model, lr=5e-2)
    with MultiServerPublisher([ws_server.url, ws_server.url], timeout_s=60) as fleet:
        assert len(fleet.publishers) == 1  # a URL listed twice is one server
        for step in (1, 2):
            trainer.step(preference_batch)
            results = fleet.publish(model, version + step, "head_only")
            assert [(r.version, r.num_params) for r in results] == [(version + step, 1)]
            assert runtime_version(ws_server.url) == version + step
            # one server: one phase (received and applied in one update; a commit would record commit_s)
            last = requests.get(f"{ws_server.url}/health", timeout=10).json()["last_update"]
            assert results[0].server["status"] == "ok" and "reload_s" in last and "commit_s" not in last
            assert_parity(ws_server.url, model, probe_ids)
        assert next(iter(fleet.publishers.values())).connected  # the session is kept between publishes
        with pytest.raises(WeightUpdateRefused, match="not newer.*it serves the old version"):
            fleet.publish(model, version + 2, "head_only")
    assert not next(iter(fleet.publishers.values())).connected


def test_an_unreachable_server_fails_before_any_publish(ws_server, dead_url):
    with pytest.raises(HttpError, match=dead_url) as err:
        MultiServerPublisher([ws_server.url, dead_url], timeout_s=10)
    assert err.value.unreachable


def test_a_managed_replica_that_cannot_be_opened_is_left_behind_and_the_others_take_the_version(
        ws_server, tiny_rm, probe_ids, caplog):
    """Managed replicas (``on_commit``): a replica that does not answer its inventory (a hung server: a proxy that
    never answers) is left behind with a warning, the version goes to the one that answers and the fleet moves to
    it; the next publish tries the hung one again."""
    from fault_proxy import FaultProxy, Faults

    version = reset_server(ws_server.url, tiny_rm)
    committed: list[int] = []
    model = load_rm(tiny_rm)
    with FaultProxy(ws_server.url, Faults(hang=True)) as hung:
        with MultiServerPublisher([ws_server.url, hung.url], on_commit=committed.append, timeout_s=5) as fleet:
            assert list(fleet.publishers) == [ws_server.url]
            assert f"server {hung.url} left behind (out of routing until re-synced): could not open" in caplog.text
            results = fleet.publish(model, version + 1, "full", probe_ids=probe_ids)
            assert [r.version for r in results] == [version + 1] and committed == [version + 1]
            assert runtime_version(ws_server.url) == version + 1
            assert_parity(ws_server.url, model, probe_ids)
            asked = sum(r["path"] == "/weight_inventory" for r in hung.requests)
            fleet.publish(model, version + 2, "full")
            assert sum(r["path"] == "/weight_inventory" for r in hung.requests) == asked + 1  # tried again
