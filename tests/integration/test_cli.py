"""Every option of ``verl-vllm-rm``'s subcommands and every flag the reward server adds to vLLM's says what it
does in ``--help``. docs/reference/cli.md and configuration.md are generated from the same parsers (checked current
by tests/integration/docs/test_reference_pages.py), so ``--help`` and the docs say the same thing."""

from __future__ import annotations

import argparse

import pytest

from verl_vllm_rm.cli import build_parser
from verl_vllm_rm.dev.reference_docs.flags import Flag, flags_of
from verl_vllm_rm.dev.reference_docs.pages import subcommands
from verl_vllm_rm.dev.reference_docs.server_flags import read_server_flags


def without_help(flags: list[Flag]) -> list[str]:
    return [flag.names[0] for flag in flags if not flag.help.strip()]


def test_every_option_of_every_subcommand_has_a_help_text():
    commands = subcommands(build_parser())
    silent = {name: without_help(flags_of(sub._actions)) for name, (_, sub) in commands.items()}
    assert not {name: flags for name, flags in silent.items() if flags}, silent
    assert all(summary for summary, _ in commands.values())
    assert set(commands) >= {"serve", "score", "check", "report", "demo", "bench", "tiny-ppo", "tiny-rm",
                             "reference-docs"}


@pytest.mark.server  # the server's parser is vLLM's: built in the server environment
def test_every_flag_the_server_adds_has_a_help_text():
    flags = list(read_server_flags().plugin)
    assert {"--step-tag-id", "--enable-weight-updates"} <= {name for flag in flags for name in flag.names}
    assert without_help(flags) == []


def test_an_option_without_a_help_text_is_named():
    parser = argparse.ArgumentParser()
    parser.add_argument("--documented", help="what it does")
    parser.add_argument("--bare")
    parser.add_argument("positional", help=" ")
    assert without_help(flags_of(parser._actions)) == ["--bare", "positional"]
