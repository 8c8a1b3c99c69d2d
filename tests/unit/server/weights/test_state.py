"""The server's weight-sync state, without vLLM: a /score that waited at the gate through a reload that left the
weights lost never scores on them."""

from __future__ import annotations

import asyncio

import pytest

from verl_vllm_rm.server.weights.state import WeightsLost, WeightSyncState


def test_a_score_waiting_through_a_reload_that_lost_the_weights_is_refused_inside_the_gate():
    async def scenario() -> None:
        state = WeightSyncState(version=3)

        async def score() -> int:
            async with state.scoring() as version:
                return version

        async with state.gate.updating_weights():  # the reload
            request = asyncio.create_task(score())  # passed the route's early check: nothing was lost yet
            await asyncio.sleep(0)
            assert not request.done()  # held at the gate
            state.lost = "the reload failed half-way (RuntimeError: boom) and could not be undone: ..."
        with pytest.raises(WeightsLost, match=r"^this server's weights are lost: the reload failed half-way "
                                              r"\(RuntimeError: boom\) and could not be undone: \.\.\.; it scores "
                                              r"nothing until a full publish \(training_mode full\) succeeds or it "
                                              r"restarts$"):
            await request
        state.lost = None  # a full publish succeeded
        assert await score() == 3

    asyncio.run(scenario())
