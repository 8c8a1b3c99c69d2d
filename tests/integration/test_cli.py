"""Every option of ``verl-vllm-rm``'s subcommands and every flag the reward server adds to vLLM's says what it
does in ``--help``. docs/reference/cli.md and configuration.md are generated from the same parsers (checked current
by tests/integration/docs/test_reference_pages.py), so ``--help`` and the docs say the same thing."""

from __future__ import annotations

import pytest
from cli_flags import without_help

from verl_vllm_rm.dev.reference_docs.server_flags import read_server_flags
from verl_vllm_rm.replicas.launcher import SERVER_PYTHON_ENV


@pytest.mark.server  # the server's parser is vLLM's: built in the server environment
def test_every_flag_the_server_adds_has_a_help_text():
    flags = list(read_server_flags().plugin)
    assert {"--step-tag-id", "--enable-weight-updates"} <= {name for flag in flags for name in flag.names}
    assert without_help(flags) == []


@pytest.mark.server
def test_the_servers_flags_are_read_once_per_interpreter(monkeypatch):
    """Each read imports vLLM (~10 s of CPU): a process reads them once, and reads again for another interpreter
    (another server environment), whose failure is its own."""
    assert read_server_flags() is read_server_flags()
    monkeypatch.setenv(SERVER_PYTHON_ENV, "/bin/false")
    with pytest.raises(RuntimeError, match="reading the reward server's flags failed in /bin/false"):
        read_server_flags()
