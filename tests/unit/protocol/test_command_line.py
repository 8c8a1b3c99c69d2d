"""Reading one flag's value from a raw command line (the server's, as the fleet and the server read it)."""

from __future__ import annotations

import pytest

from verl_vllm_rm.protocol.command_line import flag_value


@pytest.mark.parametrize("args, value", [
    (("--tensor-parallel-size", "2"), "2"),
    (("--tensor-parallel-size=4",), "4"),
    (("-tp", "2", "--tensor-parallel-size=4"), "4"),  # the last of the names, as argparse takes it
    (("--tensor-parallel-size=4", "-tp", "2"), "2"),
    (("--max-model-len", "512"), None),  # not given
    (("--tensor-parallel-size",), None),  # no value after it
    (("--tensor-parallel-size-x", "3"), None),  # another flag with the name as its prefix
])
def test_the_value_of_the_last_of_the_names(args, value):
    assert flag_value(args, ("--tensor-parallel-size", "-tp")) == value
