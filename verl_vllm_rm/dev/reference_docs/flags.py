"""An argparse option as plain data: what the reference prints of it and the code-block check looks up.

Standard library only: the reward server's environment (vLLM, no verl) imports it to describe its own parser.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class Flag:
    """One option or positional argument of a parser."""

    names: tuple[str, ...]  # option strings (``--url``), or the positional's name alone
    help: str  # with argparse's ``%(default)s``-style placeholders filled in
    default: Any
    choices: tuple[Any, ...] | None
    metavar: str | None
    takes_value: bool  # False for a switch (store_true, store_const, ...)
    required: bool  # a positional of nargs * or ? is not, whatever argparse's own flag says

    @property
    def positional(self) -> bool:
        return not self.names[0].startswith("-")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _help(action: argparse.Action) -> str:
    """``action.help`` as ``--help`` prints it (argparse expands ``%(default)s`` and the like)."""
    text = action.help or ""
    if "%" not in text:
        return text
    return text % {**{k: v for k, v in vars(action).items() if v is not None}, "prog": ""}


def flags_of(actions: Iterable[argparse.Action]) -> list[Flag]:
    """Every action but ``--help``, as :class:`Flag`s (JSON-safe: the server's go through a subprocess)."""
    return [Flag(names=tuple(a.option_strings) or (a.dest,), help=_help(a),
                 default=a.default if a.default is None or isinstance(a.default, (str, int, float, bool))
                 else repr(a.default),
                 choices=tuple(a.choices) if a.choices is not None else None,
                 metavar=a.metavar if isinstance(a.metavar, str) else None,
                 takes_value=a.nargs != 0, required=a.required and a.nargs not in ("*", "?"))
            for a in actions if not isinstance(a, argparse._HelpAction)]
