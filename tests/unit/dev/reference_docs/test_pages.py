"""The generated reference pages (``dev/reference_docs/pages.py``) from small inputs: a subcommand's flag table and
its anchors, the reward server's section of the configuration page, which checked-in pages are stale, and no API
key of the one generating them reaching a page. (The package's own pages, current and complete: tests/unit/docs/
and tests/integration/docs/test_reference_pages.py.)"""

from __future__ import annotations

import argparse

from verl_vllm_rm.dev.reference_docs.flags import Flag
from verl_vllm_rm.dev.reference_docs.pages import (REFERENCE, _fresh_environment, cli_page, configuration_page,
                                                   stale_pages)
from verl_vllm_rm.dev.reference_docs.server_flags import ServerFlags
from verl_vllm_rm.protocol.defaults import API_KEY_ENV


def tool() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-vllm-rm", description="Score   things\n with ``vllm``.")
    commands = parser.add_subparsers(dest="command")
    score = commands.add_parser("score", help="score a file")
    score.add_argument("path", help="the JSONL file")
    score.add_argument("--url", required=True, help="the server")
    score.add_argument("--mode", choices=["a|b", "c"], default="c", help="`a|b` or c | d")
    score.add_argument("--batch", type=int, default=8, metavar="N", help="rows a request")
    score.add_argument("--timeout", type=float, help="seconds")
    score.add_argument("--quiet", action="store_true", help="print nothing")
    commands.add_parser("check")
    return parser


def test_each_subcommand_gets_a_heading_and_a_row_per_flag_with_its_anchor():
    page = cli_page(tool())
    assert "Score things with `vllm`. Installed with the package" in page
    score = page.split("## `verl-vllm-rm score` {#score}\n\nScore a file.\n\n")[1].split("\n\n")[0].splitlines()
    assert score == [
        "| flag | default | allowed | meaning |",
        "|---|---|---|---|",
        '| <a id="score-path"></a>`path` | required |  | the JSONL file |',
        '| <a id="score--url"></a>`--url VALUE` | required |  | the server |',
        '| <a id="score--mode"></a>`--mode` | `c` | `a|b`, `c` | `a|b` or c \\| d |',
        '| <a id="score--batch"></a>`--batch N` | `8` |  | rows a request |',
        '| <a id="score--timeout"></a>`--timeout VALUE` |  |  | seconds |',
        '| <a id="score--quiet"></a>`--quiet` |  |  | print nothing |',
    ]
    check = page.split("## `verl-vllm-rm check` {#check}\n\n")[1]
    assert "| flag | default | allowed | meaning |\n|---|---|---|---|\n" in check and "<a id" not in check


def test_the_servers_section_names_the_vllm_defaults_it_changes_and_its_own_flags():
    server = ServerFlags(frozenset({"--port", "--step-tag-id"}),
                         (Flag(("--step-tag-id",), "the step tag's token id", None, None, "ID", True, False),),
                         {"max_model_len": 512, "enforce_eager": True})
    page = configuration_page(server)
    assert "It changes vLLM's defaults to `--enforce-eager true`, `--max-model-len 512`, and on CPU" in page
    assert ('| <a id="server--step-tag-id"></a>`--step-tag-id ID` |  |  | the step tag\'s token id |'
            in page.split("## `python -m verl_vllm_rm.server` {#server}")[1])
    assert "## `reward.reward_kwargs` {#reward_kwargs}" in page and "## `+online_rm` {#online_rm}" in page


def test_a_page_is_stale_when_its_file_is_missing_or_says_something_else(tmp_path):
    pages = {REFERENCE / "a.md": "A\n", REFERENCE / "b.md": "B\n", REFERENCE / "c.md": "C\n"}
    (tmp_path / REFERENCE).mkdir(parents=True)
    (tmp_path / REFERENCE / "a.md").write_text("A\n")
    (tmp_path / REFERENCE / "b.md").write_text("B, edited\n")
    assert stale_pages(pages, tmp_path) == [REFERENCE / "b.md", REFERENCE / "c.md"]


def test_the_pages_are_made_without_the_generating_users_api_key(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "secret")
    with _fresh_environment():
        import os

        assert API_KEY_ENV not in os.environ
    assert os.environ[API_KEY_ENV] == "secret"  # given back after
    monkeypatch.delenv(API_KEY_ENV)
    with _fresh_environment():
        pass
    assert API_KEY_ENV not in os.environ
