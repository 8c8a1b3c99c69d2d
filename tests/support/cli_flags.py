"""A parser's flags without ``--help``, as the CLI tests compare them."""

from __future__ import annotations

from verl_vllm_rm.dev.reference_docs.flags import Flag


def without_help(flags: list[Flag]) -> list[str]:
    return [flag.names[0] for flag in flags if not flag.help.strip()]
