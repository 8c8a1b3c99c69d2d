"""An argparse parser's options as plain data (``dev/reference_docs/flags.py``): names, the help text as ``--help``
prints it, a JSON-safe default, choices, metavar, whether the option takes a value and whether it is required."""

from __future__ import annotations

import argparse
import json

from verl_vllm_rm.dev.reference_docs.flags import Flag, flags_of


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tool")
    p.add_argument("model", help="the checkpoint")
    p.add_argument("extra", nargs="*", help="more checkpoints")
    p.add_argument("--port", "-p", type=int, default=8000, help="listen on %(default)s (%(prog)s's default)")
    p.add_argument("--mode", choices=["fast", "exact"], default="exact", help="one of %(choices)s")
    p.add_argument("--dry-run", action="store_true", help="print, do not run")
    p.add_argument("--url", required=True, metavar="URL")
    p.add_argument("--pair", nargs=2, metavar=("A", "B"), default=[1, 2], help="100%% literal")
    return p


def test_every_action_but_help_becomes_a_flag_in_the_parsers_order():
    assert [f.names for f in flags_of(parser()._actions)] == [
        ("model",), ("extra",), ("--port", "-p"), ("--mode",), ("--dry-run",), ("--url",), ("--pair",)]


def test_each_flag_says_what_help_prints_and_what_the_option_takes():
    flags = {f.names[0]: f for f in flags_of(parser()._actions)}
    assert flags["--port"] == Flag(("--port", "-p"), "listen on 8000 ('s default)", 8000, None, None, True, False)
    assert flags["--mode"].help == "one of ['fast', 'exact']" and flags["--mode"].choices == ("fast", "exact")
    assert (flags["--dry-run"].takes_value, flags["--dry-run"].default, flags["--dry-run"].help) == (
        False, False, "print, do not run")
    assert (flags["--url"].required, flags["--url"].metavar, flags["--url"].help, flags["--url"].default) == (
        True, "URL", "", None)


def test_an_escaped_percent_sign_is_printed_as_help_prints_it():
    flags = {f.names[0]: f for f in flags_of(parser()._actions)}
    assert flags["--pair"].help == "100% literal"
    assert "100% literal" in parser().format_help()


def test_a_default_json_cannot_carry_is_its_repr_and_a_tuple_metavar_is_dropped():
    flags = {f.names[0]: f for f in flags_of(parser()._actions)}
    assert flags["--pair"].default == "[1, 2]" and flags["--pair"].metavar is None
    assert json.loads(json.dumps([f.as_dict() for f in flags_of(parser()._actions)]))[6]["default"] == "[1, 2]"


def test_a_positional_of_nargs_star_is_not_required_and_positionals_know_they_are():
    flags = {f.names[0]: f for f in flags_of(parser()._actions)}
    assert (flags["model"].positional, flags["model"].required) == (True, True)
    assert (flags["extra"].positional, flags["extra"].required) == (True, False)
    assert not flags["--port"].positional and not flags["--port"].required


def test_as_dict_gives_every_field_by_name():
    flag = Flag(("--x",), "h", 1, ("a",), "X", True, False)
    assert flag.as_dict() == {"names": ("--x",), "help": "h", "default": 1, "choices": ("a",), "metavar": "X",
                              "takes_value": True, "required": False}
