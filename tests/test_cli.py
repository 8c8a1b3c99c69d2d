"""``verl-vllm-rm``'s command line: every option of every subcommand says what it does in ``--help``."""

from __future__ import annotations

import argparse

from verl_vllm_rm.cli import build_parser


def test_every_option_of_every_subcommand_has_a_help_text():
    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    silent = [f"{name} {'/'.join(action.option_strings) or action.dest}"
              for name, sub in subcommands.items() for action in sub._actions
              if not isinstance(action, argparse._HelpAction) and not action.help]
    assert silent == []
    assert set(subcommands) >= {"serve", "score", "check", "report", "demo", "bench", "tiny-ppo", "tiny-rm"}
