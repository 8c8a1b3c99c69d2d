"""``plugin.server_check`` on the real server: a run whose RM lists a server that answers and one that refuses
connections starts, with one warning naming the one that does not answer (a run none of whose servers answers:
tests/unit/plugin/test_server_check.py; in main_ppo: tests/integration/dev/test_tiny_ppo_online.py)."""

from __future__ import annotations

import logging

from log_records import messages_of

from verl_vllm_rm.plugin.server_check import check_listed_servers
from verl_vllm_rm.scoring.options import parse_options


def test_a_server_that_does_not_answer_beside_one_that_does_is_named_in_a_warning(rm_server, dead_url, caplog):
    options = parse_options({"server_url": [rm_server.url, dead_url], "max_retries": 0})
    with caplog.at_level(logging.WARNING, logger="verl_vllm_rm.plugin.server_check"):
        check_listed_servers(options)
    warnings = messages_of(caplog, "verl_vllm_rm.plugin.server_check")
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"reward model 'rm': its server {dead_url} does not answer /health (requests fail "
                                  "over to the others until it does): GET /health failed after 1 attempt(s)")
    assert rm_server.url not in warnings[0]  # the server that answers is not named
