"""The weight-sync tests' fault server: a real server whose reloads a test can make fail (the test-only switch
``RELOAD_FAULT_ENV``) and whose transfers stall out after ``FAULT_SERVER_STALL_S``; shared by the reload-rollback
and transfer-stall modules (one start per xdist worker that runs either)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sync_helpers import FAULT_SERVER_STALL_S, faulty_server


@pytest.fixture(scope="session")
def fault_file(tmp_path_factory) -> Path:
    """Where a test writes the reload faults it wants (``reload_fault``'s file; absent: none)."""
    return tmp_path_factory.mktemp("reload_fault") / "fail_after"


@pytest.fixture(scope="session")
def fault_server(tiny_rm, server_args, fault_file):
    with faulty_server(tiny_rm, server_args, fault_file, "--weight-update-stall-timeout",
                       str(FAULT_SERVER_STALL_S)) as server:
        yield server
