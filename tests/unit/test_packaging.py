"""Install-level contracts: entry points, console script, the disk check, and the pinned environments.

Which side imports vllm or verl is checked on the import graph (``test_layout.py``)."""

import re
import subprocess
import sys
from importlib.metadata import entry_points

from verl_vllm_rm.dev.gpu_lock import canonical, read_lock
from verl_vllm_rm.replicas.launcher import find_server_python
from repo_paths import REPO as ROOT



def test_console_script_and_plugin_entry_point_are_declared():
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts["verl-vllm-rm"] == "verl_vllm_rm.cli:main"
    plugins = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert plugins["vllm_rm"] == "verl_vllm_rm.plugin.register"


def test_setup_refuses_to_start_on_a_full_disk(tmp_path):
    """`make setup` checks free space before pip starts, and says what to free (CI once died of
    pip's bare 'No space left on device' half way through the server install)."""
    repo = ROOT
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "df").write_text("#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted'\n"
                                 "echo '/dev/x 100000000 99000000 1048576 99% /'\n")
    (fake_bin / "df").chmod(0o755)
    venv = tmp_path / "venv-server"
    result = subprocess.run(
        ["make", "-C", str(repo), f"VENV_SERVER={venv}", f"{venv}/.installed-cpu"],
        capture_output=True, text=True, env={"PATH": f"{fake_bin}:/usr/bin:/bin"},
    )
    assert result.returncode != 0
    assert f"building {venv} needs about 3 GB free on this disk, 1 GB are free" in result.stderr
    assert "remove old clones or virtual environments" in result.stderr
    assert not venv.exists(), "nothing may be installed after the refusal"


def _pinned(*files: str) -> dict[str, str]:
    return {canonical(k): v for name in files for k, v in read_lock(ROOT / "requirements" / name).items()}


def _installed(python: str) -> dict[str, str]:
    lines = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert all("==" in line for line in lines), f"installed from outside a registry: {lines}"
    return {canonical(line.split("==")[0]): line.split("==")[1] for line in lines}


def test_environments_hold_exactly_the_pinned_sets():
    """Everything installed is pinned, at its pinned version, so a fresh machine gets the same set
    (an unpinned transitive dependency would float to whatever the registry serves that day)."""
    gallery = re.search(r"rm-gallery==([\w.]+)", (ROOT / "Makefile").read_text()).group(1)
    expected = {
        sys.executable: {**_pinned("trainer.txt", "gallery.txt", "docs.txt"), "rm-gallery": gallery},
        find_server_python(): _pinned("server.txt"),
    }
    for python, pins in expected.items():
        installed = _installed(python)
        assert installed == pins, {
            "installed, not pinned": {k: v for k, v in installed.items() if k not in pins},
            "pinned, not installed": {k: v for k, v in pins.items() if k not in installed},
            "other version": {k: (v, installed[k]) for k, v in pins.items() if installed.get(k, v) != v},
        }
