"""The RM trainer on verl's training engine, 1 and 2 ranks, ``full`` and ``lora``, on the same pairs.

Real Ray worker groups of verl's ``TrainingWorker`` (FSDP2 on gloo through the CPU harness) and
the real weight-update server. One module-scoped set of runs feeds every assertion: for each
mode and rank count, two RM steps (one pair per micro-batch: gradients accumulate), each published
with the parity probe, the server's scores and every rank's reference scores after each; the 2-rank
runs are checkpointed, ``full`` resumed, both exported; ``head_only`` runs with verl's offload.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sync_helpers import PARITY_ATOL, engine_rm_config, max_diff, reset_server, runtime_version, server_scores


BUCKET_BYTES = 1 << 16  # 64 KiB: the tiny RM (1.7 MB) takes many buckets; its embedding (512 kB) one alone


LOSS_TOLERANCE = 1e-5  # fp32 compute; 1 and 2 ranks differ only in the order of the reductions


def rm_config(tiny_rm: str, url: str, mode: str, ranks: int, **options):
    return engine_rm_config(tiny_rm, url, mode, ranks, bucket_bytes=BUCKET_BYTES, **options)


@pytest.fixture(scope="module")
def runs(ray_cluster, ws_server, tiny_rm, rollout, probe_ids, tmp_path_factory):
    """(mode, ranks) -> the run's start version, per-step records and per-rank state bytes; the 2-rank full
    run's checkpoint folder."""
    from verl_vllm_rm.online.driver import OnlineRewardModel

    uids, sequences, rewards, _ = rollout
    out, checkpoints = {}, tmp_path_factory.mktemp("rm_engine")
    for mode, ranks in (("full", 1), ("full", 2), ("lora", 1), ("lora", 2), ("head_only", 1)):
        start = reset_server(ws_server.url, tiny_rm)
        # verl's parameter and optimizer offload between steps (head_only run): train and publish all the same
        offload = dict(param_offload=True, optimizer_offload=True) if mode == "head_only" else {}
        rm = OnlineRewardModel(rm_config(tiny_rm, ws_server.url, mode, ranks, **offload))
        steps = []
        for step in (1, 2):
            metrics = rm.train_on_rollout(uids, sequences, rewards, step=step)
            steps.append({"metrics": metrics, "version": runtime_version(ws_server.url),
                          "served": server_scores(ws_server.url, probe_ids),
                          "reference": rm.worker_group.reference_scores(probe_ids)})
        out[mode, ranks] = {"start": start, "steps": steps, "state": rm.worker_group.state_bytes()}
        if ranks == 2:
            rm.save_checkpoint(str(checkpoints / mode / "online_rm"))
        rm.close()  # its workers and placement group: every run of the module fits in the cluster
    return out, checkpoints


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_each_of_two_ranks_holds_half_the_parameters_gradients_and_optimizer_state(runs, mode):
    """Read from the engine's own tensors at the optimizer update (gradients and Adam's moments held)."""
    one, two = runs[0][mode, 1]["state"][0], runs[0][mode, 2]["state"]
    for kind in ("params", "grads", "optimizer"):
        assert one[kind] > 0
        for rank in two:
            assert 0.45 <= rank[kind] / one[kind] <= 0.55, (kind, rank[kind], one[kind])
        assert sum(rank[kind] for rank in two) == pytest.approx(one[kind], rel=0.01)  # sharded, not replicated


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_the_first_step_loss_on_two_ranks_is_the_one_rank_loss(runs, mode):
    """The same pairs, one micro-batch per pair (gradients accumulate): the same global mean BT loss."""
    one, two = (runs[0][mode, r]["steps"][0]["metrics"] for r in (1, 2))
    assert one["rm/pairs"] == two["rm/pairs"] == 4
    assert abs(one["rm/bt_loss"] - two["rm/bt_loss"]) <= LOSS_TOLERANCE
    assert runs[0][mode, 2]["steps"][1]["metrics"]["rm/bt_loss"] < two["rm/bt_loss"]  # it learns


@pytest.mark.parametrize("key", [("full", 1), ("full", 2), ("lora", 1), ("lora", 2), ("head_only", 1)])
def test_every_step_publishes_the_next_version_and_the_server_scores_like_the_trainer(runs, key):
    run = runs[0][key]
    for step, record in enumerate(run["steps"], 1):
        assert record["version"] == record["metrics"]["rm/published_version"] == run["start"] + step
        if key[0] == "lora":  # the session's server holds the LoRA bases: only the adapters travel
            assert record["metrics"]["rm/publish_lora_adapters"] == 1.0
        assert record["metrics"]["rm/parity_max_abs_diff"] <= PARITY_ATOL
        ranks = record["reference"]
        assert max_diff(record["served"], ranks[0]) <= PARITY_ATOL
        assert all(max_diff(other, ranks[0]) <= 1e-6 for other in ranks[1:])  # one model, however sharded
    assert max_diff(run["steps"][1]["served"], run["steps"][0]["served"]) > 1e-4  # the second step moved it


@pytest.mark.parametrize("key", [("full", 1), ("full", 2), ("lora", 2)])
def test_a_publish_gathers_one_bucket_at_a_time_never_the_whole_model(runs, key):
    """Counted by the gathered tensors' own lifetimes on each rank: at most a bucket (or the one tensor larger
    than a bucket: the 512 kB embedding), never the model (1.7 MB full, 0.6 MB of merged LoRA modules)."""
    metrics = runs[0][key]["steps"][0]["metrics"]
    embedding = 1000 * 128 * 4
    assert 0 < metrics["rm/publish_peak_gathered_bytes"] <= max(BUCKET_BYTES, embedding)
    assert metrics["rm/publish_peak_gathered_bytes"] < metrics["rm/publish_bytes"]


def test_a_resumed_two_rank_run_continues_from_the_saved_rm(runs, ray_cluster, ws_server, tiny_rm, probe_ids):
    """verl's per-rank checkpoint of the engine, restored on 2 ranks and published before anything scores; on
    another rank count it is refused, naming the fix."""
    from verl_vllm_rm.online.driver import OnlineRewardModel

    saved = runs[0]["full", 2]["steps"][1]["reference"][0]
    reset_server(ws_server.url, tiny_rm)
    assert max_diff(server_scores(ws_server.url, probe_ids), saved) > 1e-3
    resumed = OnlineRewardModel(rm_config(tiny_rm, ws_server.url, "full", 2))
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert 10000 <= int(resumed.worker_group.master_port) < ephemeral_low  # never a port handed out as a source
    metrics = resumed.resume(str(runs[1] / "full" / "online_rm"))
    assert metrics["rm/parity_max_abs_diff"] <= PARITY_ATOL
    assert max_diff(server_scores(ws_server.url, probe_ids), saved) <= PARITY_ATOL
    assert max_diff(resumed.worker_group.reference_scores(probe_ids)[0], saved) <= 1e-6
    resumed.close()
    one_rank = OnlineRewardModel(rm_config(tiny_rm, ws_server.url, "full", 1))
    with pytest.raises(Exception, match=r"saved by 2 RM rank\(s\) in training_mode=full; this run has 1 in full.*"
                                        r"resume with the same \+online_rm.num_workers"):
        one_rank.resume(str(runs[1] / "full" / "online_rm"))
    one_rank.close()


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_the_trained_rm_exports_from_verls_checkpoint_and_scores_like_the_trainer(runs, mode, probe_ids, tmp_path):
    """Both ranks' shards joined in fp32 (LoRA merged) into the sequence classifier the run started from."""
    from verl_vllm_rm.online.export import export_trained_rm
    from verl_vllm_rm.parity.reference import load_reward_model, sequence_scores

    out = export_trained_rm(runs[1] / mode / "online_rm", tmp_path / "exported")
    trained = runs[0][mode, 2]["steps"][1]["reference"][0]
    assert max_diff(sequence_scores(load_reward_model(str(out)), probe_ids), trained) <= 1e-5


def test_a_checkpoint_whose_rm_was_replaced_is_refused_on_export_naming_the_fix(runs, tmp_path):
    """rm_state.json names the model the run started from; another one there now (here: one layer, not two) does
    not take the checkpoint's weights, and the export says which and where the model is read from."""
    import json
    import shutil

    from verl_vllm_rm.dev.tiny_rm import TinyRMSpec, build_tiny_rm
    from verl_vllm_rm.online.export import RM_STATE_FILE, export_trained_rm

    folder = tmp_path / "online_rm"
    shutil.copytree(runs[1] / "full" / "online_rm", folder)
    other = build_tiny_rm(tmp_path / "one-layer-rm", TinyRMSpec(num_hidden_layers=1))
    state = json.loads((folder / RM_STATE_FILE).read_text())
    (folder / RM_STATE_FILE).write_text(json.dumps({**state, "model_path": str(other)}))
    with pytest.raises(ValueError, match=rf"the checkpoint at {folder} does not fit its RM {other}: missing \[\], "
                                         r"unexpected \['model.layers.1.[^']*'.*\]. The RM is rebuilt from model_path "
                                         rf"in {RM_STATE_FILE} \(the run's online_rm.model_path\): put the model"):
        export_trained_rm(folder, tmp_path / "exported")
    assert not (tmp_path / "exported").exists()


def test_an_rm_whose_head_does_not_load_is_refused_naming_it(ray_cluster, tiny_rm, tmp_path):
    """A classifier whose head is not named like the token classifier's (here ``score`` renamed) would start
    from a random head in verl's value model: refused at set-up, naming the weight and the fix."""
    import shutil

    from safetensors.torch import load_file, save_file

    from verl_vllm_rm.online.driver import OnlineRewardModel

    renamed = tmp_path / "renamed-head"
    shutil.copytree(tiny_rm, renamed)
    weights = load_file(renamed / "model.safetensors")
    weights["value_head.weight"] = weights.pop("score.weight")
    save_file(weights, renamed / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(Exception, match=r"1 weight\(s\) of the RM at .* did not load into verl's value model "
                                        r"\(Qwen2ForTokenClassification\): \['score.weight'\] \(the head\)"):
        OnlineRewardModel(rm_config(str(renamed), "http://127.0.0.1:1", "full", 1))
