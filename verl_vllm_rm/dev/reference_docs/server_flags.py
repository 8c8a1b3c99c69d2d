"""The reward server's command line, read from its own parser (``server/entry.py``'s ``build_parser``).

That parser is vLLM's with the plugin's group added, so it is built where vLLM is installed: one run of the server
environment's interpreter (:func:`~verl_vllm_rm.replicas.launcher.find_server_python`) describes it as JSON.
"""

from __future__ import annotations

import functools
import json
import subprocess
from dataclasses import dataclass
from typing import Any

from verl_vllm_rm.dev.reference_docs.flags import Flag
from verl_vllm_rm.replicas.launcher import find_server_python

#: the argument group ``build_parser`` puts the plugin's own flags in
PLUGIN_GROUP = "verl-vllm-rm"

SCRIPT = f"""
import json
from verl_vllm_rm.dev.reference_docs.flags import flags_of
from verl_vllm_rm.server.entry import build_parser

parser = build_parser()
plugin = next(g for g in parser._action_groups if g.title == {PLUGIN_GROUP!r})
print(json.dumps({{
    "options": sorted(o for a in parser._actions for o in a.option_strings),
    "plugin": [f.as_dict() for f in flags_of(plugin._group_actions)],
    "defaults": {{k: v for k, v in parser._defaults.items() if isinstance(v, (str, int, float, bool))}},
}}))
"""


@dataclass(frozen=True)
class ServerFlags:
    """What ``python -m verl_vllm_rm.server`` accepts."""

    options: frozenset[str]  # every option string, vLLM's and the plugin's
    plugin: tuple[Flag, ...]  # the plugin's own flags
    defaults: dict[str, Any]  # vLLM settings whose default the plugin changes (``set_defaults``), by dest


def read_server_flags() -> ServerFlags:
    """The server's flags, from its parser in the server environment (:func:`find_server_python`)."""
    return _flags_in(find_server_python())


@functools.cache
def _flags_in(python: str) -> ServerFlags:
    """The flags of the server installed for ``python``; read once per process and interpreter (each read imports
    vLLM: ~10 s of CPU), so generating and checking the pages in one process reads them once."""
    proc = subprocess.run([python, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"reading the reward server's flags failed in {python}:\n{proc.stderr[-3000:]}")
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    plugin = tuple(Flag(**{**f, "names": tuple(f["names"]),
                           "choices": None if f["choices"] is None else tuple(f["choices"])}) for f in raw["plugin"])
    return ServerFlags(frozenset(raw["options"]), plugin, raw["defaults"])
