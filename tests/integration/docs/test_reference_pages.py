"""docs/reference/ is generated (``verl-vllm-rm reference-docs``) and checked in: it must be what the generator
writes from the code now, every option field carries its meaning in the code, and ``--check`` names a stale page.

Generating reads the reward server's parser in the server environment (vLLM): those tests are marked ``server``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_vllm_rm.cli import build_parser, main
from verl_vllm_rm.dev.reference_docs.pages import (REFERENCE, generate, stale_pages)
from repo_paths import REPO as ROOT


@pytest.fixture(scope="module")
def pages() -> dict[Path, str]:
    return generate(build_parser)


@pytest.mark.server  # the server's flags come from its parser, in the server environment
def test_the_checked_in_pages_are_what_the_generator_writes(pages):
    assert set(pages) == {REFERENCE / "configuration.md", REFERENCE / "cli.md", REFERENCE / "errors.md"}
    assert stale_pages(pages, ROOT) == [], "run `verl-vllm-rm reference-docs` and commit docs/reference/"


@pytest.mark.server
def test_check_exits_1_naming_the_stale_page_and_writes_nothing(pages, tmp_path, capsys):
    for path, text in pages.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert main(["reference-docs", "--check", "--root", str(tmp_path)]) == 0
    (tmp_path / REFERENCE / "cli.md").write_text("hand-edited\n")
    assert main(["reference-docs", "--check", "--root", str(tmp_path)]) == 1
    assert "docs/reference/cli.md is stale: run `verl-vllm-rm reference-docs` and commit it" in capsys.readouterr().err
    assert (tmp_path / REFERENCE / "cli.md").read_text() == "hand-edited\n"
