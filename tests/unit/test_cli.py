"""Every option of ``verl-vllm-rm``'s subcommands and every flag the reward server adds to vLLM's says what it
does in ``--help``. docs/reference/cli.md and configuration.md are generated from the same parsers (checked current
by tests/integration/docs/test_reference_pages.py), so ``--help`` and the docs say the same thing: the in-process tests (no server; those on the real server: tests/integration/test_cli.py)."""

from __future__ import annotations

import argparse

from cli_flags import without_help

from verl_vllm_rm.cli import build_parser
from verl_vllm_rm.dev.reference_docs.flags import flags_of
from verl_vllm_rm.dev.reference_docs.pages import subcommands


def test_every_option_of_every_subcommand_has_a_help_text():
    commands = subcommands(build_parser())
    silent = {name: without_help(flags_of(sub._actions)) for name, (_, sub) in commands.items()}
    assert not {name: flags for name, flags in silent.items() if flags}, silent
    assert all(summary for summary, _ in commands.values())
    assert set(commands) >= {"serve", "score", "check", "report", "demo", "bench", "tiny-ppo", "tiny-rm",
                             "reference-docs"}


def test_an_option_without_a_help_text_is_named():
    parser = argparse.ArgumentParser()
    parser.add_argument("--documented", help="what it does")
    parser.add_argument("--bare")
    parser.add_argument("positional", help=" ")
    assert without_help(flags_of(parser._actions)) == ["--bare", "positional"]
