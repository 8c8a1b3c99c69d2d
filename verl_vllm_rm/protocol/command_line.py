"""The server's command line as both sides read it raw, before (or without) vLLM's parser: the fleet sizing a
replica's bundle from its ``server_args``, the server checking ``--model`` before it imports vLLM."""

from __future__ import annotations

from collections.abc import Sequence


def flag_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of ``names`` in ``args`` (``--flag value`` or ``--flag=value``), as argparse takes
    the last; None when no such flag has a value."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in names:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value
