"""Every benchmark result the docs cite is a stored artefact: each ``results/NAME.json`` named in README.md, docs/
or benchmarks/README.md exists under benchmarks/results and parses as JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path
from repo_paths import REPO as ROOT

RESULTS = ROOT / "benchmarks" / "results"
CITATION = re.compile(r"results/([A-Za-z0-9_.-]+\.json)")


def cited_results(text: str) -> set[str]:
    return set(CITATION.findall(text))


def unstored(names: set[str], results: Path = RESULTS) -> list[str]:
    """The cited names with no readable JSON file under ``results``."""
    missing = []
    for name in sorted(names):
        try:
            json.loads((results / name).read_text())
        except (OSError, ValueError):
            missing.append(name)
    return missing


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_results_file_the_docs_cite_is_stored():
    cited = set().union(*(cited_results(p.read_text()) for p in pages()))
    assert {"bf16_parity.json", "grpo_scoring.json", "weight_sync.json"} <= cited  # the scan finds citations
    assert unstored(cited) == []


def test_a_cited_file_that_is_missing_or_not_json_is_named(tmp_path):
    (tmp_path / "broken.json").write_text("{half")
    (tmp_path / "fine.json").write_text("{}")
    text = "see results/fine.json, `benchmarks/results/broken.json` and results/gone.json"
    assert unstored(cited_results(text), tmp_path) == ["broken.json", "gone.json"]
