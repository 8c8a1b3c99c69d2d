"""Every flag and config key that a code block of README.md or docs/ names exists.

What is checked, in each fenced block: the flags after ``python -m verl_vllm_rm.server`` (the server's parser:
vLLM's flags and the plugin's), after ``verl-vllm-rm <subcommand>`` (that subcommand's parser; ``serve`` passes
the rest on to the server), and the keys of ``reward.reward_kwargs.*`` and ``online_rm.*`` overrides, down into
the mappings and lists they set (parsed as Hydra parses them), against the option dataclasses; in a YAML block,
the keys under ``reward: reward_kwargs:`` and ``online_rm:``. Other programs' flags (pytest, pip, make, verl's
``main_ppo``) and verl's own keys are not ours and are left alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_code_blocks import Known, cli_options, problems
from repo_paths import REPO as ROOT

from verl_vllm_rm.dev.reference_docs.server_flags import read_server_flags


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.server  # the server's flags come from its parser, in the server environment
def test_every_flag_and_key_in_the_docs_code_blocks_exists():
    known = Known(read_server_flags().options, cli_options())
    found = {str(p.relative_to(ROOT)): problems(p.read_text(), known) for p in documents()}
    assert not {k: v for k, v in found.items() if v}, found
