"""The GPU quick start (docs/quickstart.md, "On GPUs"; the README's brief) works as written, from a clone.

Its install lines are the Makefile's ``DEVICE=gpu`` lines, and pip (the pinned resolver of ``make lock-gpu``)
resolves each one, from this clone and the package index alone, to exactly the pinned set it names. Resolution is what runs here (``pip install
--dry-run``): installing the CUDA builds (torch, vLLM, NCCL: about 10 GB an environment) is a GPU machine's
job. The package itself is installed from the clone for real, not editable, into a fresh environment that
borrows the trainer side's dependencies, and imported from there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_lock_prefetch import prefetched, resolve_lines
from quick_start_lines import ENVIRONMENTS, gpu_section, pip_lines
from repo_paths import REPO as ROOT

from verl_vllm_rm.dev.gpu_lock import LOCKS, NCCL, installed_set, read_lock, resolve


@pytest.fixture(scope="module")
def first_lines(request, tmp_path_factory) -> dict:
    """The resolver pip's interpreter and each environment's first install line resolved by it, from the index
    alone (the two side by side: ~2 min, a few MB of downloads): under make test xdist's controller ran them
    from the start of the run (tests/support/gpu_lock_prefetch.py), else they run here."""
    return prefetched(request.config) or resolve_lines(tmp_path_factory.mktemp("resolver"))


@pytest.fixture(scope="module")
def resolver(first_lines) -> Path:
    """The interpreter of an environment with the pinned resolver pip."""
    return Path(first_lines["resolver"])


@pytest.fixture(scope="module")
def resolved(resolver, first_lines) -> dict[str, dict[str, str]]:
    """The quick start's lines resolved; an environment's later ``--no-deps`` lines replace the pins they name."""
    lines = pip_lines(gpu_section())
    sets = {extra: dict(pins) for extra, pins in first_lines["sets"].items()}
    for env, installs in lines.items():
        for args in installs[1:]:
            assert args[:2] == ["--no-deps", "-r"], args
            sets[ENVIRONMENTS[env]].update(read_lock(ROOT / args[2]))
    return sets


@pytest.mark.server  # the package index
@pytest.mark.parametrize("extra", list(LOCKS))
def test_each_quick_start_line_resolves_to_exactly_its_pinned_set(resolved, extra):
    pins = installed_set(extra)
    got = resolved[extra]
    assert got == pins, {
        "resolved, not pinned": {k: v for k, v in got.items() if k not in pins},
        "pinned, not resolved (stale: run `make lock-gpu`)": {k: v for k, v in pins.items() if k not in got},
    }


@pytest.mark.server  # the package index
def test_the_gpu_sets_hold_the_cuda_builds_the_quick_start_names(resolved):
    server, trainer = resolved["server-gpu"], resolved["verl-gpu"]
    assert (server["vllm"], server["torch"]) == ("0.32.0", "2.13.0")
    assert (trainer["verl"], trainer["vllm"], trainer["torch"]) == ("0.9.1", "0.24.0", "2.11.0")
    assert "+" not in server["torch"] + trainer["torch"], "a local build (e.g. +cpu) leaked into a GPU set"
    assert {"nvidia-nccl-cu13", "nvidia-cublas"} <= set(server) & set(trainer)
    assert server[NCCL] == trainer[NCCL], "NCCL refuses peers of another version: run `make lock-gpu`"
    torch_declares = read_lock(ROOT / LOCKS["verl-gpu"])[NCCL]
    assert f"declare NCCL {torch_declares} (trainer) and {server[NCCL]} (server)" in gpu_section()


@pytest.mark.server  # the package index
def test_a_resolver_pip_that_does_not_install_is_named_with_pips_words(tmp_path, monkeypatch):
    import verl_vllm_rm.dev.gpu_lock as gpu_lock

    monkeypatch.setattr(gpu_lock, "RESOLVER_PIP", "pip==0.0.1")  # no such release on the index
    with pytest.raises(RuntimeError, match=r"^could not install the resolver \(pip==0\.0\.1\):\n.*pip==0\.0\.1"):
        gpu_lock.resolver_python(tmp_path / "env")


@pytest.mark.server  # the package index
def test_a_line_that_does_not_resolve_is_named_with_pips_words(resolver):
    with pytest.raises(RuntimeError, match=r"^`pip install verl-vllm-rm-no-such-dist==0\.0\.1` does not resolve:\n"
                                           r"(?s:.*)verl-vllm-rm-no-such-dist"):
        resolve(["verl-vllm-rm-no-such-dist==0.0.1"], resolver)
