"""Fixtures for weight-sync tests: one real server with ``--enable-weight-updates`` per session.

Tests change the served weights, so each test starts from a known state with
``sync_helpers.reset_server`` (publishes the on-disk tiny RM in full under the next version).
"""

from __future__ import annotations

import random

import pytest

from verl_vllm_rm.server_process import running_server
from verl_vllm_rm.tiny_rm import synthetic_corpus
from verl_vllm_rm.training.bt import collate_pairs


@pytest.fixture(scope="session")
def ws_server(tiny_rm, server_args):
    """The reward server with weight updates enabled (gloo transport on CPU)."""
    with running_server(tiny_rm, [*server_args, "--enable-weight-updates"]) as server:
        yield server


@pytest.fixture(scope="session")
def probe_ids(tokenizer) -> list[list[int]]:
    """Eight probe sequences of different lengths (token ids)."""
    lines = synthetic_corpus(n_lines=8, seed=99)
    return [tokenizer(line[: 20 + 9 * i])["input_ids"] for i, line in enumerate(lines)]


@pytest.fixture(scope="session")
def preference_batch(tokenizer):
    """Arithmetic pairs: chosen states the right answer, rejected a wrong one."""
    rng = random.Random(5)
    chosen, rejected = [], []
    for _ in range(8):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        chosen.append(tokenizer(f"What is {a} + {b}? The answer is {a + b}.")["input_ids"])
        rejected.append(tokenizer(f"What is {a} + {b}? The answer is {a + b + rng.randint(1, 9)}.")["input_ids"])
    return collate_pairs(chosen, rejected, tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for the verl worker-group tests of one module.

    16 logical CPUs: each worker group holds a placement group for the module's life,
    and TransferQueue's controller and storage units take one each.
    """
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=16, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()
