"""The CPU harness's ``cpu_gloo`` checkpoint engine moves every weight exactly, as verl's manager drives it:
prepare on every rank, the topology from the metadata, one gloo group for the update, send on actor rank 0 and
receive on each rollout worker, finalize. Two actor ranks (one walks the weights and sends nothing) and two
rollout workers, in threads of this process (a gloo group does not care)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from verl_vllm_rm.dev.cpu_harness.checkpoint_engine import CPUGlooCheckpointEngine

BUCKET = 1 << 10  # 1 KiB: the 3 KiB tensor crosses in chunks, the small ones share buckets


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(24, 32, generator=g),                   # 3 KiB: chunked over buckets
        "norm.weight": torch.randn(7, generator=g).to(torch.bfloat16),     # 14 bytes: the next chunk misaligned
        "head.weight": torch.randn(3, 5, generator=g),
        "positions": torch.arange(9, dtype=torch.int64),
        "scale": torch.tensor(0.5, dtype=torch.float16),
    }


def run_update(sent: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    actors = [CPUGlooCheckpointEngine(BUCKET, is_master=True), CPUGlooCheckpointEngine(BUCKET)]
    rollouts = [CPUGlooCheckpointEngine(BUCKET), CPUGlooCheckpointEngine(BUCKET)]
    metadata = [engine.prepare() for engine in actors + rollouts]
    actor_kwargs, rollout_kwargs = CPUGlooCheckpointEngine.build_topology(len(actors), len(rollouts), metadata)
    received: list[dict[str, torch.Tensor]] = [{}, {}]
    walked: list[str] = []
    errors: list[BaseException] = []

    def actor(i: int) -> None:
        engine = actors[i]
        engine.init_process_group(**{k: v[i] for k, v in actor_kwargs.items()})
        stream = iter(sent.items()) if i == 0 else ((walked.append(name), (name, t))[1] for name, t in sent.items())
        asyncio.run(engine.send_weights(stream))

    def rollout(i: int) -> None:
        engine = rollouts[i]
        engine.init_process_group(**{k: v[i] for k, v in rollout_kwargs.items()})

        async def receive() -> None:
            async for name, tensor in engine.receive_weights():
                received[i][name] = tensor.clone()

        asyncio.run(receive())

    def guarded(target, i):
        try:
            target(i)
        except BaseException as error:  # reported below, with the thread's own traceback
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(f, i)) for f in (actor, rollout) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert walked == list(sent), "the actor rank outside the group must still walk every weight"
    for engine in actors + rollouts:
        engine.finalize()
    return received


def test_every_weight_arrives_bit_exact_on_every_rollout_worker():
    sent = weights()
    for received in run_update(sent):
        assert list(received) == list(sent)
        for name, tensor in sent.items():
            assert received[name].dtype == tensor.dtype and received[name].shape == tensor.shape, name
            assert torch.equal(received[name], tensor), name


def test_a_second_update_builds_a_group_of_its_own():
    """verl rebuilds the group at every update (prepare .. finalize): a new port and session each time."""
    first, second = weights(), {name: tensor + 1 for name, tensor in weights().items()}
    run_update(first)
    assert all(torch.equal(second[name], tensor) for name, tensor in run_update(second)[1].items())


def test_the_topology_needs_actor_rank_0_as_master():
    with pytest.raises(ValueError, match="actor rank 0 must be the checkpoint engine's master"):
        CPUGlooCheckpointEngine.build_topology(1, 1, [{}, {}])


def test_only_rollout_workers_receive():
    engine = CPUGlooCheckpointEngine(BUCKET, is_master=True)

    async def receive() -> None:
        async for _ in engine.receive_weights():
            pass

    with pytest.raises(RuntimeError, match=r"only rollout workers \(rank >= 1\) receive weights"):
        asyncio.run(receive())
