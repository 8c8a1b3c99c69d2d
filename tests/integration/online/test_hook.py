"""The verl path: preference pairs from a rollout batch, the RM step as a verl worker method
(real Ray worker group, ``@register`` dispatch), and the publish hook after it."""

from __future__ import annotations

from sync_helpers import PARITY_ATOL, max_diff, reset_server, runtime_version, server_scores



def test_rm_step_worker_method_publishes_every_n_steps(ray_cluster, ws_server, tiny_rm, rollout, probe_ids):
    from verl_vllm_rm.dev.cpu_profile import CPU_RM_ENGINE
    from verl_vllm_rm.online.config import OnlineRMConfig
    from verl_vllm_rm.online.driver import OnlineRewardModel

    reset_server(ws_server.url, tiny_rm)
    config = OnlineRMConfig.from_dict(dict(model_path=tiny_rm, server_url=ws_server.url, training_mode="lora",
                                           publish_every=2, lr=5e-3, lora_rank=4, timeout_s=60, parity_every=1,
                                           **CPU_RM_ENGINE))
    online = OnlineRewardModel(config)
    uids, sequences, rewards, _ = rollout
    start = runtime_version(ws_server.url)
    for step in range(1, 5):
        metrics = online.train_on_rollout(uids, sequences, rewards)
        assert metrics["rm/pairs"] == 4 and metrics["rm/bt_loss"] > 0
        trainer_scores = online.worker_group.reference_scores(probe_ids)[0]
        served = server_scores(ws_server.url, probe_ids)
        if step % 2 == 0:
            assert metrics["rm/published_version"] == start + step // 2
            assert metrics["rm/parity_max_abs_diff"] <= PARITY_ATOL  # the probe ran on the step's own pairs
            assert metrics["rm/parity_mult_error"] <= 1.05
            assert max_diff(served, trainer_scores) <= PARITY_ATOL
        else:
            assert "rm/published_version" not in metrics
            assert max_diff(served, trainer_scores) > 1e-3  # trained but not yet published
        assert runtime_version(ws_server.url) == start + step // 2
