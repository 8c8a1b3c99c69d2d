"""The GPU quick start (docs/quickstart.md, "On GPUs"; the README's brief) works as written, from a clone.

Its install lines are the Makefile's ``DEVICE=gpu`` lines, and pip (the pinned resolver of ``make lock-gpu``)
resolves each one, from this clone and the package index alone, to exactly the pinned set it names. Resolution is what runs here (``pip install
--dry-run``): installing the CUDA builds (torch, vLLM, NCCL: about 10 GB an environment) is a GPU machine's
job. The package itself is installed from the clone for real, not editable, into a fresh environment that
borrows the trainer side's dependencies, and imported from there.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from verl_vllm_rm.dev.gpu_lock import (LOCKS, NCCL, NCCL_PIN, OVERRIDES, installed_set, read_lock, resolve,
                                       resolver_python)
from repo_paths import REPO as ROOT

ENVIRONMENTS = {".venv-server": "server-gpu", ".venv": "verl-gpu"}  # the quick start's environment -> its extra


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def gpu_section() -> str:
    """docs/quickstart.md's "On GPUs": the install lines of record."""
    return section((ROOT / "docs" / "quickstart.md").read_text(), "## On GPUs")


def readme_gpu_section() -> str:
    return section((ROOT / "README.md").read_text(), "## Quick start on GPUs")


def pip_lines(text: str) -> dict[str, list[list[str]]]:
    """``{environment: [pip install arguments, ...]}`` of every ``ENV/bin/pip install ...`` in ``text``, in order
    (a line ending in a backslash continues on the next)."""
    found: dict[str, list[list[str]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        for command in line.split("&&"):
            if "/bin/pip install" not in command:
                continue
            words = shlex.split(command.split("#", 1)[0])
            if len(words) > 2 and words[0].endswith("/bin/pip") and words[1] == "install":
                found.setdefault(words[0].removesuffix("/bin/pip"), []).append(words[2:])
    return found


def expected_installs(extra: str) -> list[list[str]]:
    """The lock-constrained install, then (the trainer's) the pins it takes over its torch's own."""
    installs = [["-c", LOCKS[extra], "-e", f".[{extra}]"]]
    if extra in OVERRIDES:
        installs.append(["--no-deps", "-r", OVERRIDES[extra]])
    return installs


def test_the_readme_brief_points_at_the_quick_start_and_adds_no_install_line_of_its_own():
    brief = readme_gpu_section()
    assert "make setup DEVICE=gpu" in brief and "docs/quickstart.md#on-gpus" in brief
    page = pip_lines(gpu_section())
    for env, installs in pip_lines(brief).items():
        assert all(args in page.get(env, []) for args in installs), (env, installs, page)


def test_the_quick_start_gpu_lines_are_what_make_setup_device_gpu_runs(tmp_path):
    page = pip_lines(gpu_section())
    assert set(page) == set(ENVIRONMENTS), page
    for env, extra in ENVIRONMENTS.items():
        assert page[env] == expected_installs(extra)
    # the environments' stamps do not exist under these names: make prints every command of the GPU build
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "setup", "DEVICE=gpu",
                          f"VENV={tmp_path / 'v'}", f"VENV_SERVER={tmp_path / 'vs'}"],
                         capture_output=True, text=True, check=True).stdout
    made = {Path(env).name: args for env, args in pip_lines(dry).items()}
    assert made == {"vs": page[".venv-server"], "v": page[".venv"]}, dry
    # and it says what each environment gets, from the lock files
    says = "\n".join(line for line in dry.splitlines() if line.startswith('echo "make: '))
    told = subprocess.run(["bash", "-c", says], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name, extra in (("v", "verl-gpu"), ("vs", "server-gpu")):
        pins = read_lock(ROOT / LOCKS[extra])
        line = next(line for line in told.splitlines() if line.startswith(f"make: {tmp_path / name} <- "))
        assert f"torch=={pins['torch']} " in line and f"vllm=={pins['vllm']} " in line, told
    nccl = f"make: {tmp_path / 'v'} <- {NCCL_PIN}: {NCCL}=={read_lock(ROOT / NCCL_PIN)[NCCL]} (over torch"
    assert nccl in told, told


def test_the_environments_must_match_the_device(tmp_path):
    """A CPU environment is never reinstalled with the GPU set on top (nor the reverse)."""
    venv = tmp_path / "v"
    venv.mkdir()
    (venv / ".installed-cpu").touch()
    run = subprocess.run(["make", "-C", str(ROOT), "setup", "DEVICE=gpu", f"VENV={venv}",
                          f"VENV_SERVER={tmp_path / 'vs'}"], capture_output=True, text=True)
    assert run.returncode != 0
    assert f"make: {venv} was built with DEVICE=cpu; run with DEVICE=cpu, or `make clean` first" in run.stderr
    assert not (tmp_path / "vs").exists() and not (venv / "bin").exists(), "nothing may be installed"
    bad = subprocess.run(["make", "-n", "-C", str(ROOT), "setup", "DEVICE=tpu"], capture_output=True, text=True)
    assert bad.returncode != 0 and "DEVICE must be cpu or gpu, not 'tpu'" in bad.stderr


def test_both_gpu_environments_run_one_nccl():
    """The weight publish is an NCCL broadcast between the two environments: NCCL refuses a peer of another
    version, so what each installs (its lock, then its overrides) holds the same NCCL, the server's."""
    server, trainer = installed_set("server-gpu"), installed_set("verl-gpu")
    assert server[NCCL] == trainer[NCCL] == read_lock(ROOT / NCCL_PIN)[NCCL], (server[NCCL], trainer[NCCL])
    assert read_lock(ROOT / LOCKS["verl-gpu"])[NCCL] != trainer[NCCL], "the override is no longer needed: drop it"
    assert f"NCCL {server[NCCL]}" in (ROOT / "docs" / "weight_sync.md").read_text()


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The quick start's lines, resolved by the pinned resolver pip from the index alone (the two environments
    side by side: ~1 min, a few MB of downloads); an environment's later ``--no-deps`` lines replace the pins
    they name."""
    lines = pip_lines(gpu_section())
    python = resolver_python(tmp_path_factory.mktemp("resolver") / "env")
    with ThreadPoolExecutor(2) as pool:
        futures = {ENVIRONMENTS[env]: pool.submit(resolve, installs[0], python) for env, installs in lines.items()}
        sets = {extra: future.result() for extra, future in futures.items()}
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


def test_the_package_installs_from_the_clone_not_editable(tmp_path):
    """``pip install`` of the clone's tree (a copy: the build writes into the source directory) puts every
    module of the package in the environment; with the trainer side's dependencies borrowed, verl finds the
    plugin there."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    source = tmp_path / "clone"
    for name in tracked.splitlines():
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run([str(env / "bin" / "pip"), "install", "--quiet", "--no-deps", str(source)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.run([str(env / "bin" / "python"), "-c", purelib],
                               capture_output=True, text=True, check=True).stdout.strip())
    package = source / "verl_vllm_rm"
    wanted = {p.relative_to(source) for p in package.rglob("*.py")}
    assert {p.relative_to(site) for p in (site / "verl_vllm_rm").rglob("*.py")} == wanted
    (site / "trainer_side.pth").write_text(sysconfig.get_path("purelib") + "\n")  # verl, torch, ... of .venv
    probe = ("import verl_vllm_rm, importlib.metadata as m; "
             "eps = [e for e in m.entry_points(group='verl.plugins') if e.name == 'vllm_rm']; "
             "print(verl_vllm_rm.__file__); print(eps[0].load().__file__)")
    out = subprocess.run([str(env / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert all(line.startswith(str(site)) for line in out.stdout.split()), out.stdout


@pytest.mark.server  # the package index
def test_a_resolver_pip_that_does_not_install_is_named_with_pips_words(tmp_path, monkeypatch):
    import verl_vllm_rm.dev.gpu_lock as gpu_lock

    monkeypatch.setattr(gpu_lock, "RESOLVER_PIP", "pip==0.0.1")  # no such release on the index
    with pytest.raises(RuntimeError, match=r"^could not install the resolver \(pip==0\.0\.1\):\n.*pip==0\.0\.1"):
        gpu_lock.resolver_python(tmp_path / "env")
