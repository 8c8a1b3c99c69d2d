"""What the docs pages state about the code, checked against it (the README's own checks: tests/unit/test_readme.py)."""

import re
from repo_paths import REPO as ROOT

DOCS = ROOT / "docs"


def _section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_every_verl_seam_is_documented():
    """docs/development.md's table of verl's private seams lists exactly the members of ``SEAMS``, each in its verl
    class's row, with the modules that use it."""
    from verl_vllm_rm.plugin.verl_seams import SEAMS

    section = _section("development.md", "## verl's private seams")
    rows = {m["owner"]: m for m in re.finditer(r"^\| `(?P<owner>\w+)` \(`(?P<file>[\w/.]+)`\) \| (?P<members>.+?) \| "
                                              r"(?P<used_by>.+?) \|$", section, re.M)}
    assert set(rows) == {seam.owner for seam in SEAMS}
    for owner, row in rows.items():
        seams = [seam for seam in SEAMS if seam.owner == owner]
        assert {f"verl/{row['file']}"} == {seam.verl_file for seam in seams}
        assert re.findall(r"`(\w+)`", row["members"]) == [seam.member for seam in seams]
        assert set(re.findall(r"`([\w/.]+)`", row["used_by"])) == {path for seam in seams for path in seam.used_by}


def test_every_cpu_harness_patch_is_documented():
    """docs/development.md's table of the CPU harness's patches is exactly the patches the harness applies."""
    from verl_vllm_rm.dev.cpu_harness.patches import PATCHES

    section = _section("development.md", "## verl's own main_ppo on CPU")
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.M))
    assert documented == {p.name for p in PATCHES}
