"""The GPU quick start (docs/quickstart.md, "On GPUs"; the README's brief) works as written, from a clone: the in-process tests (no server; those on the real server: tests/integration/dev/test_gpu_lock.py)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

from quick_start_lines import ENVIRONMENTS, gpu_section, pip_lines, section
from repo_paths import REPO as ROOT

from verl_vllm_rm.dev.gpu_lock import LOCKS, NCCL, NCCL_PIN, OVERRIDES, installed_set, read_lock


def readme_gpu_section() -> str:
    return section((ROOT / "README.md").read_text(), "## Quick start on GPUs")


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
