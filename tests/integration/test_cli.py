"""Every option of ``verl-vllm-rm``'s subcommands and every flag the reward server adds to vLLM's says what it
does in ``--help``. docs/reference/cli.md and configuration.md are generated from the same parsers (checked current
by tests/integration/docs/test_reference_pages.py), so ``--help`` and the docs say the same thing."""

from __future__ import annotations

import pytest
from cli_flags import without_help

from verl_vllm_rm.dev.reference_docs.server_flags import read_server_flags


@pytest.mark.server  # the server's parser is vLLM's: built in the server environment
def test_every_flag_the_server_adds_has_a_help_text():
    flags = list(read_server_flags().plugin)
    assert read_server_flags() is read_server_flags()  # read once per process: each read imports vLLM
    assert {"--step-tag-id", "--enable-weight-updates"} <= {name for flag in flags for name in flag.names}
    assert without_help(flags) == []
