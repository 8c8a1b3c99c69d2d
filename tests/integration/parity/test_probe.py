"""The parity probe a publisher runs after every N publishes (real server, real gloo transport)."""

from __future__ import annotations

import pytest
import torch
from sync_helpers import PARITY_ATOL, load_rm, reset_server, runtime_version, update_record

from verl_vllm_rm.weight_sync import ParityError, ParityProbe, RewardModelPublisher
from verl_vllm_rm.dev.offline_bt import OfflineBradleyTerry
from verl_vllm_rm.online.trainable import prepare_reward_model


def test_probe_runs_every_n_publishes_and_reports_parity(ws_server, tiny_rm, probe_ids, preference_batch):
    reset_server(ws_server.url, tiny_rm)
    model = prepare_reward_model(load_rm(tiny_rm), "full")
    trainer = OfflineBradleyTerry(model, lr=5e-3)
    with RewardModelPublisher(ws_server.url, timeout_s=60, parity_probe=ParityProbe(every=2)) as pub:
        for n in range(1, 5):
            trainer.step(preference_batch)
            result = pub.publish(model, runtime_version(ws_server.url) + 1, "full", probe_ids=probe_ids)
            if n % 2:
                assert result.parity is None
                continue
            assert result.parity["ok"] and result.parity["probes"] == len(probe_ids)
            assert result.parity["max_abs_diff"] <= PARITY_ATOL
            assert 1.0 <= result.parity["mult_error"] <= 1.0 + PARITY_ATOL


def test_probe_catches_a_backbone_that_trained_but_was_published_head_only(ws_server, tiny_rm, probe_ids):
    reset_server(ws_server.url, tiny_rm)
    model = load_rm(tiny_rm)
    with torch.no_grad():  # what a full fine-tune does to the backbone, published as head_only by mistake
        model.model.norm.weight.mul_(3.0)
        model.score.weight.add_(0.05)
    with RewardModelPublisher(ws_server.url, timeout_s=60, parity_probe=ParityProbe(every=1)) as pub:
        version = pub.version + 1
        with pytest.raises(ParityError, match="training_mode covers every tensor") as err:
            pub.publish(model, version, "head_only", probe_ids=probe_ids)
    assert err.value.report.mult_error > 1.05 and not err.value.report.ok
    assert runtime_version(ws_server.url) == version  # the head did go out; the probe reports the drift


def test_probe_due_without_a_model_or_probes_is_refused_before_sending(ws_server, tiny_rm, probe_ids):
    """Refused before sending: the publisher posts no metadata and the server records no update."""
    reset_server(ws_server.url, tiny_rm)
    model = load_rm(tiny_rm)
    before = update_record(ws_server.url)
    with RewardModelPublisher(ws_server.url, timeout_s=60, parity_probe=ParityProbe(every=1)) as pub:
        posted = []
        post_lines = pub.http.post_lines  # how a publisher sends /update_param_batch
        pub.http.post_lines = lambda path, *a, **kw: posted.append(path) or post_lines(path, *a, **kw)
        start = pub.version
        with pytest.raises(ValueError, match="pass the model itself"):
            pub.publish(model.state_dict(), start + 1, "full", probe_ids=probe_ids)
        with pytest.raises(ValueError, match="probe_ids"):
            pub.publish(model, start + 1, "full")
        assert posted == []
    assert runtime_version(ws_server.url) == start
    assert update_record(ws_server.url) == before


def test_the_fp32_bound_fails_a_difference_the_multiplicative_threshold_lets_through(ws_server, tiny_rm, probe_ids,
                                                                                   hf_model):
    """fp32 on both sides: max |diff| <= 1e-4, whatever mean(exp|diff|) says (1e-3 everywhere is 1.001 there)."""
    from verl_vllm_rm.parity.reference import sequence_scores

    reset_server(ws_server.url, tiny_rm)
    off_by = [s + 1e-3 for s in sequence_scores(hf_model, probe_ids)]
    probe = ParityProbe(every=1)
    with pytest.raises(ParityError, match=r"max \|diff\| 0.001 \(bound 0.0001 for float32 compute\)") as err:
        probe.compare(off_by, probe_ids, ws_server.url, None, version=1)
    assert err.value.report.mult_error < probe.threshold
    report = probe.compare(off_by, probe_ids, ws_server.url, None, version=1, dtype="bfloat16")
    assert report.ok and report.max_abs_bound > 1e-2  # the same spread is inside a bf16 side's bound
