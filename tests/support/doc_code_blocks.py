"""The code blocks of README.md and docs/, and the flags and config keys they name that do not exist."""

from __future__ import annotations

import re
import shlex
import typing
from dataclasses import dataclass
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from verl_vllm_rm.cli import build_parser
from verl_vllm_rm.dev.reference_docs.pages import ENTRY_SECTIONS, subcommands
from verl_vllm_rm.dev.reference_docs.sections import nested_section
from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.options import option_fields
from verl_vllm_rm.scoring.options import ManagerOptions

SHELL_BLOCKS = {"", "bash", "sh", "shell", "console", "text"}
OVERRIDE = re.compile(r"\+{0,2}(reward\.reward_kwargs|online_rm)\.[\w.]+=")
ROOTS = {"reward.reward_kwargs": ManagerOptions, "online_rm": OnlineRMConfig}
PYTHON = re.compile(r"(.*/)?python[\d.]*")
FLAG = re.compile(r"--?[A-Za-z][\w-]*")


@dataclass(frozen=True)
class Known:
    server: frozenset[str]  # every option string of ``python -m verl_vllm_rm.server``
    cli: dict[str, frozenset[str]]  # ``verl-vllm-rm`` subcommand -> its option strings


def cli_options() -> dict[str, frozenset[str]]:
    return {name: frozenset(o for a in sub._actions for o in a.option_strings)
            for name, (_, sub) in subcommands(build_parser()).items()}


def code_blocks(markdown: str) -> list[tuple[int, str, str]]:
    """(line of the opening fence, language, text) of every fenced block."""
    blocks, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        opening = re.match(r"\s*(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if opening:
            fence, start = opening.group(1), i
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                i += 1
            blocks.append((start + 1, opening.group(2).lower(), "\n".join(lines[start + 1:i])))
        i += 1
    return blocks


def key_problems(cls: type, parts: list[str], value: Any, path: str) -> list[str]:
    """The keys of ``parts`` (a dotted override key) and of ``value`` below it that ``cls``'s options lack."""
    owners = {f.name: owner for f, owner in option_fields(cls)}  # an inline section's keys at its parent's level
    head, rest = parts[0], parts[1:]
    if head not in owners:
        return [f"{path}.{head}"]
    section, many = nested_section(typing.get_type_hints(owners[head])[head])
    if (cls, head) in ENTRY_SECTIONS:
        section, many = ENTRY_SECTIONS[cls, head], True
    if section is None or (rest and many):  # a mapping of free keys (weights, attributes), or a list index
        return []
    if rest:
        return key_problems(section, rest, value, f"{path}.{head}")
    items = value if many and isinstance(value, list) else [value]
    return [problem for item in items if isinstance(item, dict) for key, inner in item.items()
            for problem in key_problems(section, [str(key)], inner, f"{path}.{head}")]


def override_problems(word: str) -> list[str]:
    match = OVERRIDE.match(word)
    if not match:
        return []
    try:
        override = OverridesParser.create().parse_override(word)
        key, value = override.key_or_group, override.value()
    except HydraException:  # a placeholder value (<path>): the key is still checked
        key, value = word.lstrip("+").split("=", 1)[0], None
    root = match.group(1)
    return [f"unknown key {problem}" for problem in
            key_problems(ROOTS[root], key.removeprefix(root + ".").split("."), value, root)]


def flag_problems(words: list[str], known: Known) -> list[str]:
    """The flags of our two programs in one command that their parsers lack."""
    checked: list[tuple[str, frozenset[str], str]] = []  # (flag, valid options, program)
    for i, word in enumerate(words):
        if PYTHON.fullmatch(word) and words[i + 1:i + 3] == ["-m", "verl_vllm_rm.server"]:
            checked += [(w.replace("_", "-"), known.server, "python -m verl_vllm_rm.server") for w in words[i + 3:]]
        elif (word.rsplit("/", 1)[-1] == "verl-vllm-rm" and i + 1 < len(words)
              and re.fullmatch(r"[a-z-]+", words[i + 1])):
            sub, rest = words[i + 1], words[i + 2:]
            if sub not in known.cli:
                return [f"unknown subcommand verl-vllm-rm {sub}"]
            rest = rest[:rest.index("--")] if "--" in rest else rest  # tiny-ppo's Hydra overrides follow --
            valid = known.cli[sub] | (known.server if sub == "serve" else frozenset())
            checked += [(w, valid, f"verl-vllm-rm {sub}") for w in rest]
    return [f"{program} has no flag {flag.split('=')[0]}" for flag, valid, program in checked
            if FLAG.fullmatch(flag.split("=")[0]) and flag.split("=")[0] not in valid]


def commands(block: str) -> list[list[str]]:
    """A shell block's commands as words: continuation lines joined, comments and prompts dropped, split at
    ``|``, ``&&``, ``||`` and ``;``."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        line = re.sub(r"^\s*\$\s+", "", line)
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote in prose-like text: read it word by word
            words = line.split()
        command: list[str] = []
        for word in [*words, ";"]:
            if word in ("|", "&&", "||", ";"):
                found.append(command)
                command = []
            else:
                command.append(word)
    return [c for c in found if c]


def yaml_problems(block: str) -> list[str]:
    try:
        data = yaml.safe_load(block)
    except yaml.YAMLError:
        return []
    if not isinstance(data, dict):
        return []
    sections = {"online_rm": data.get("online_rm")}
    if isinstance(data.get("reward"), dict):
        sections["reward.reward_kwargs"] = data["reward"].get("reward_kwargs")
    return [f"unknown key {problem}" for root, section in sections.items() if isinstance(section, dict)
            for key, value in section.items() for problem in key_problems(ROOTS[root], [str(key)], value, root)]


def problems(markdown: str, known: Known) -> list[str]:
    found = []
    for line, language, text in code_blocks(markdown):
        if language in ("yaml", "yml"):
            found += [f"line {line}: {p}" for p in yaml_problems(text)]
        elif language in SHELL_BLOCKS:
            for words in commands(text):
                found += [f"line {line}: {p}" for p in flag_problems(words, known)]
                found += [f"line {line}: {p}" for word in words for p in override_problems(word)]
    return found
