"""The documentation site builds: ``mkdocs build --strict`` with the project's mkdocs.yml passes (a broken link or
anchor, a page missing from the nav, fails it), and its toolchain is pinned in step with the trainer locks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from verl_vllm_rm.dev.gpu_lock import canonical, read_lock
from repo_paths import REPO as ROOT

MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "--config-file", str(config), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strict(tmp_path):
    run = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


def test_the_project_config_fails_a_broken_anchor(tmp_path):
    """The strictness is the project's mkdocs.yml's own: a link to a missing anchor fails the build."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n[the option](other.md#no-such-option)\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## An option\n")
    config.update(docs_dir=str(tmp_path / "docs"), nav=["index.md", "other.md"])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    run = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert run.returncode != 0
    assert "does not contain an anchor '#no-such-option'" in run.stdout + run.stderr


def test_the_docs_pins_are_exact_and_agree_with_the_trainer_locks():
    """requirements/docs.txt installs into .venv beside trainer.txt (trainer-gpu.txt on GPUs): a package both name
    has one version, or one install would move the other's."""
    lines = [line for line in (ROOT / "requirements" / "docs.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[\w.-]+==[\w.]+", line) for line in lines), lines
    docs = read_lock(ROOT / "requirements" / "docs.txt")
    assert {"mkdocs", "mkdocs-material", "pymdown-extensions"} <= set(docs), docs
    for lock in ("trainer.txt", "trainer-gpu.txt"):
        trainer = {canonical(k): v for k, v in read_lock(ROOT / "requirements" / lock).items()}
        differ = {k: (v, trainer[canonical(k)]) for k, v in docs.items() if trainer.get(canonical(k), v) != v}
        assert not differ, f"docs.txt and {lock} pin these differently: {differ}"
