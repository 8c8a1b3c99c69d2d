"""The GPU environments' pinned sets: an install line resolved by pip against the package index alone.

``make lock-gpu`` writes ``requirements/server-gpu.txt`` and ``requirements/trainer-gpu.txt`` with
:func:`main`; the test of the GPU quick start (docs/quickstart.md) resolves its own lines with :func:`resolve`
and compares them with these files, so the page, the Makefile and the pins cannot drift apart.

The two environments must run one NCCL (the weight publish is an NCCL broadcast between them, and NCCL
refuses a peer of another version), but their torch builds declare different exact versions. pip has no
override, so ``requirements/nccl-gpu.txt`` holds the server's NCCL and the trainer's environment installs it
after its lock, without dependencies (:data:`OVERRIDES`, :func:`installed_set`).

pip runs without any configuration file and without find-links: a machine's local wheels (this
machine's CPU build of torch, which satisfies ``torch==2.13.0`` too) must not leak into the set a
GPU machine installs. The set holds for the platform it is resolved on (Linux x86_64, CPython 3.11).

The resolver is one pinned pip (:data:`RESOLVER_PIP`) in an environment of its own (:func:`resolver_python`):
a lock pins every package, so any pip finds the same set, and this pip reads a wheel's metadata with HTTP range
requests (``--use-feature=fast-deps``) where the index serves no metadata files. Without them pip downloads
every wheel whole to read it: about 4 GB of CUDA wheels a line, held in the temporary directory until the line
is resolved, which filled a CI machine's disk; with them a line reads a few MB, in under a minute.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# extra of pyproject.toml -> the file that pins what installing it brings
LOCKS = {"server-gpu": "requirements/server-gpu.txt", "verl-gpu": "requirements/trainer-gpu.txt"}
NCCL = "nvidia-nccl-cu13"
NCCL_PIN = "requirements/nccl-gpu.txt"
# extra -> the pins its environment installs over its lock (pip install --no-deps -r FILE)
OVERRIDES = {"verl-gpu": NCCL_PIN}
PROJECT = "verl-vllm-rm"
RESOLVER_PIP = "pip==26.3"
# a wheel's metadata read by HTTP range requests, not by downloading the wheel (see the module docstring)
METADATA_BY_RANGE = ("--use-feature=fast-deps",)
# settings that change which packages pip sees (certificates and time-outs stay as the machine has them)
_WHERE_PIP_LOOKS = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT",
                    "PIP_REQUIREMENT")


def index_only_env() -> dict[str, str]:
    """The environment for a pip that sees the package index and nothing of this machine's pip setup."""
    env = {k: v for k, v in os.environ.items() if k not in _WHERE_PIP_LOOKS}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all (global, user, site)
    return env


def resolver_python(directory: Path) -> Path:
    """The python of a new environment in ``directory`` holding :data:`RESOLVER_PIP` (from the index)."""
    subprocess.run([sys.executable, "-m", "venv", str(directory)], check=True)
    python = directory / "bin" / "python"
    run = subprocess.run([str(python), "-m", "pip", "install", "--quiet", RESOLVER_PIP], env=index_only_env(),
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"could not install the resolver ({RESOLVER_PIP}):\n{run.stderr[-3000:]}")
    return python


def resolve(install_args: list[str], python: Path, cwd: Path = REPO_ROOT) -> dict[str, str]:
    """``{name: version}`` that ``pip install INSTALL_ARGS`` would install into an empty environment
    (``--dry-run --ignore-installed``, with the pip of ``python``: see :func:`resolver_python`), this project
    itself left out. Raises with pip's own words."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", *METADATA_BY_RANGE,
               "--report", str(report), *install_args]
        run = subprocess.run(cmd, cwd=cwd, env=index_only_env(), capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"`pip install {' '.join(install_args)}` does not resolve:\n{run.stderr[-3000:]}")
        installs = json.loads(report.read_text())["install"]
    pins = {item["metadata"]["name"]: item["metadata"]["version"] for item in installs}
    pins.pop(PROJECT, None)
    return pins


def canonical(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """``{name: version}`` of a requirements file of ``name==version`` lines (comments allowed)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name] = version
    return pins


def installed_set(extra: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """What the environment of ``extra`` holds once installed: its lock, then its overrides on top."""
    pins = read_lock(root / LOCKS[extra])
    if extra in OVERRIDES:
        pins.update(read_lock(root / OVERRIDES[extra]))
    return pins


def write_nccl_pin(path: Path, version: str) -> None:
    path.write_text(
        "# The one NCCL both GPU environments run: the weight publish is an NCCL broadcast between them, and NCCL\n"
        "# refuses a peer of another version when the communicator forms (\"Mismatched NCCL version\").\n"
        "# torch 2.11 (the trainer's, pinned by verl 0.9.1's vLLM 0.24) declares an older exact version than torch\n"
        "# 2.13 (the server's); pip has no override, so the trainer's environment installs this one after its lock\n"
        "# (`pip install --no-deps -r requirements/nccl-gpu.txt`): the newer library keeps the older one's API.\n"
        "# Written by `make lock-gpu` from the server's set (verl_vllm_rm/dev/gpu_lock.py).\n"
        f"{NCCL}=={version}\n"
    )


def write_lock(path: Path, extra: str, pins: dict[str, str]) -> None:
    header = (f"# What `pip install \".[{extra}]\"` installs, resolved from the package index alone on "
              f"{platform.system()} {platform.machine()}, CPython {platform.python_version()}.\n"
              "# Written by `make lock-gpu` (verl_vllm_rm/dev/gpu_lock.py); used by `make setup DEVICE=gpu`.\n")
    body = "".join(f"{name}=={pins[name]}\n" for name in sorted(pins, key=canonical))
    path.write_text(header + body)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        python = resolver_python(Path(tmp) / "resolver")
        for extra, lock in LOCKS.items():
            write_resolved_lock(extra, lock, resolve(["-e", f".[{extra}]"], python))


def write_resolved_lock(extra: str, lock: str, pins: dict[str, str]) -> None:
    write_lock(REPO_ROOT / lock, extra, pins)
    print(f"{lock}: {len(pins)} packages")
    if extra == "server-gpu":
        write_nccl_pin(REPO_ROOT / NCCL_PIN, pins[NCCL])
        print(f"{NCCL_PIN}: {NCCL}=={pins[NCCL]}")


if __name__ == "__main__":
    main()
