"""The guide pages' short tables of options agree with the code on each default.

The configuration reference is generated from the option dataclasses; the guides (rewards, judge, several RMs,
replicas, online RM) keep by hand a table of the options that matter, with the default a reader meets first. A
default there is checked against the dataclass: a literal one (a number, true/false, a value in backticks) must be
the code's, and one said in words ("required", "none", "the server's max_model_len") must be where the code has
no value (``null``), or no default at all for "required", or name the items of a list default.
"""

from __future__ import annotations

import re

import pytest

from verl_vllm_rm.dev.reference_docs.sections import REQUIRED, options
from verl_vllm_rm.online.config import OnlineRMConfig
from verl_vllm_rm.scoring.options import ManagerOptions
from repo_paths import REPO

DOCS = REPO / "docs"
#: page -> the options its tables name (the routes table's rows are keys of one ``routes`` entry)
GUIDES = {"rewards.md": ManagerOptions, "judge.md": ManagerOptions, "replicas.md": ManagerOptions,
          "reward_models.md": ManagerOptions, "online_rm.md": OnlineRMConfig}
HEADER = re.compile(r"^\| (route )?option \| default \|")
CONFIG_PATH = re.compile(r"^\$[A-Z_]+$|^[a-z_]+(\.[a-z_]+)+$")  # an environment variable or a config key


def defaults_of(cls: type, prefix: str = "") -> dict[str, str]:
    """Every key under ``cls`` (nested sections' too) and its default as the reference prints it."""
    out: dict[str, str] = {}
    for option in options(cls, prefix):
        out[option.path] = option.default
        if option.section is not None:
            out.update(defaults_of(option.section, option.section_path + "."))
    return out


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|(?=(?:[^`]*`[^`]*`)*[^`]*$)", row.strip().strip("|"))]


def table_defaults(text: str) -> list[tuple[str, str]]:
    """(key, default as written) of every row of the page's option tables; a row naming several keys gives
    each its part of the default cell when it has as many parts ('; ' or ', ' apart), else the whole cell."""
    rows, prefix = [], None
    for line in text.splitlines():
        if (match := HEADER.match(line)) is not None:
            prefix = "routes[]." if match.group(1) else ""
            continue
        if prefix is None or not line.startswith("|"):
            prefix = None
            continue
        cells = _cells(line)
        if set(cells[0]) <= {"-"}:
            continue
        keys = re.findall(r"`([a-z_.]+)`", cells[0])
        parts = [cells[1]] * len(keys)
        for separator in ("; ", ", "):
            if len(keys) > 1 and len(split := cells[1].split(separator)) == len(keys):
                parts = split
                break
        rows += [(prefix + key, part.strip()) for key, part in zip(keys, parts)]
    return rows


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def disagreement(key: str, written: str, code: str | None) -> str | None:
    """Why the default ``written`` in a guide is not the code's ``code`` (None: they agree)."""
    if code is None:
        return f"{key} is not an option"
    literal = written.strip("`")
    ticked = re.fullmatch(r"`[^`]*`", written) is not None and not CONFIG_PATH.match(literal)
    if written == "required" or code == REQUIRED:
        return None if (written == "required") == (code == REQUIRED) else f"{key}: written {written!r}, code {code}"
    if ticked or _number(literal) is not None or literal in ("true", "false"):
        same = (literal == code or f"[{literal}]" == code
                or (_number(literal) is not None and _number(literal) == _number(code)))
        return None if same else f"{key}: written {written!r}, the code's default is {code}"
    if code.startswith("[") and all(word.lower() in code.lower() for word in written.split(", ")):
        return None  # a list summarised by its items' names
    return None if code == "null" else f"{key}: written {written!r} (in words), the code's default is {code}"


@pytest.mark.parametrize("page", sorted(GUIDES))
def test_the_defaults_in_a_guide_are_the_codes(page):
    rows = table_defaults((DOCS / page).read_text())
    assert rows, f"no option table in docs/{page}"
    defaults = defaults_of(GUIDES[page])
    problems = [p for key, written in rows if (p := disagreement(key, written, defaults.get(key)))]
    assert problems == [], f"docs/{page}: " + "; ".join(problems)


@pytest.mark.parametrize("row, needle", [
    ("| `max_retries` | 5 | retries |", "max_retries: written '5', the code's default is 4"),
    ("| `normalize` | true | sigmoid |", "normalize: written 'true', the code's default is null"),
    ("| `combine`, `alpha` | `replace`, 0.7 | how |", "alpha: written '0.7', the code's default is 0.5"),
    ("| `failure_policy` | unset | what |", "failure_policy: written 'unset' (in words), the code's default is raise"),
    ("| `no_such_option` | 1 | what |", "no_such_option is not an option"),
    ("| `rubric_principles` | helpfulness, kindness | what |", "rubric_principles: written 'helpfulness, kindness' (in "
                                                              "words), the code's default is ["),
], ids=["number", "bool", "pair", "words", "unknown", "list-items"])
def test_a_default_that_drifted_is_named(row, needle):
    text = f"| option | default | what it does |\n|---|---|---|\n{row}\n"
    defaults = defaults_of(ManagerOptions)
    problems = [p for key, written in table_defaults(text) if (p := disagreement(key, written, defaults.get(key)))]
    assert any(p.startswith(needle) for p in problems), problems


def test_without_rewards_and_combine_the_reward_is_the_rm_score_alone_in_code_guide_and_reference():
    """The code's default composition (no ``rewards``, no ``combine``) is ``combine=replace``: the RM score alone
    (test_manager.py's first test scores such a manager: its rewards are the RM's); an empty ``rewards: {}`` is
    RM-Gallery's recipe. docs/rewards.md and the generated reference say the same."""
    from verl_vllm_rm.rewards import RewardConfig
    from verl_vllm_rm.scoring.options import parse_options

    default = parse_options({"server_url": "http://127.0.0.1:1"}).reward_config()
    assert (default.components, dict(default.weights), default.gate) == (("rubric",), {"rubric": 1.0}, ())
    assert RewardConfig.from_dict({}).components == ("rubric", "format", "length", "ngram")
    guide = " ".join((DOCS / "rewards.md").read_text().split())
    assert ("Without `rewards` and `combine` the reward is the RM score alone (`combine=replace`, the default); an "
            "empty composition, `rewards: {}`, gives RM-Gallery's post-training recipe") in guide
    assert "the default mirrors RM-Gallery" not in guide
    reference = (DOCS / "reference" / "configuration.md").read_text()
    assert "unset: `combine` decides (`replace`: the RM score alone); `{}`: RM-Gallery's recipe" in reference
