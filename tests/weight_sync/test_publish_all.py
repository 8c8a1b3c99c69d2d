"""``VLLMRewardClient.sync_weights``: the client-level publish, then the client sees the new version."""

import asyncio

import pytest
from sync_helpers import assert_parity, load_rm, reset_server

from verl_vllm_rm.scoring.client import VLLMRewardClient
from verl_vllm_rm.weight_sync import WeightUpdateRefused
from verl_vllm_rm.online.bt import BradleyTerryTrainer, prepare_reward_model


def test_sync_weights_publishes_and_bumps_the_version(ws_server, tiny_rm, probe_ids, preference_batch):
    reset_server(ws_server.url, tiny_rm)
    model = prepare_reward_model(load_rm(tiny_rm), "head_only")
    BradleyTerryTrainer(model, lr=5e-2).step(preference_batch)
    client = VLLMRewardClient(ws_server.url)

    async def go():
        try:
            before = await client.get_model_version()
            results = await client.sync_weights(model, before + 1, "head_only")
            with pytest.raises(WeightUpdateRefused, match="not newer"):
                await client.sync_weights(model, before + 1, "head_only")
            return before, results, await client.get_model_version()
        finally:
            await client.close()

    before, results, after = asyncio.run(go())
    assert after == before + 1 and [r.version for r in results] == [after] and results[0].num_params == 1
    assert_parity(ws_server.url, model, probe_ids)
