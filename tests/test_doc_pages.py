"""What the docs pages state about the code, checked against it (the README's own checks: tests/test_readme.py)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_every_cpu_harness_patch_is_documented():
    """docs/development.md's table of the CPU harness's patches is exactly the patches the harness applies."""
    from verl_vllm_rm.dev.cpu_harness.patches import PATCHES

    section = _section("development.md", "## verl's own main_ppo on CPU")
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M))
    assert documented == {p.name for p in PATCHES}
